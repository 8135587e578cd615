"""The api's app layer alone: POST /v1/tasks called as ASGI in process, no HTTP server and
no sockets to the client, on a fresh redis-server (AOF, appendfsync no: the code path,
not the fsync waits).

`--concurrency` (32) coroutines each send `--creates` requests in turn, as 32 keep-alive
connections would, so the coalescer pipelines them as it does under load. The figure is
this process's CPU per create (user + sys): authentication, the body read and decoded,
the limits, the coalescer and its Redis pipeline, the answer encoded. Set beside
bench/api.py's api CPU per create, the difference is what the HTTP server (uvicorn,
httptools, the socket reads and writes) costs.

Run:  .venv/bin/python bench/api_app.py
      .venv/bin/python bench/api_app.py --profile out.prof   (cProfile one more round)
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import tempfile
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import uvloop

from timewheel.api import create_app
from timewheel.config import Settings
from timewheel.engine import Engine
from timewheel.store.server import RedisServer
from timewheel.tenants import Limits

RESULTS = Path(__file__).resolve().parent / "results" / "api_app.json"
BODY = b'{"delay":60,"payload":"' + b"x" * 98 + b'"}'


async def measure(url: str, args: argparse.Namespace) -> list[float]:
    settings = Settings(redis_url=url, admin_key="tw_bench_admin")
    engine = await Engine.connect(settings)
    try:
        app = create_app(settings, engine=engine)
        await app.state.tenant_store.create_tenant("bench", Limits())
        _, key = await app.state.tenant_store.issue_key("bench")
        headers = [
            (b"host", b"bench"),
            (b"authorization", b"Bearer " + key.encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(BODY)).encode()),
        ]

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": BODY, "more_body": False}

        async def one() -> None:
            sent: list[MutableMapping[str, Any]] = []

            async def send(message: MutableMapping[str, Any]) -> None:
                sent.append(message)

            scope = {
                "type": "http",
                "asgi": {"version": "3.0"},
                "http_version": "1.1",
                "method": "POST",
                "scheme": "http",
                "path": "/v1/tasks",
                "raw_path": b"/v1/tasks",
                "query_string": b"",
                "root_path": "",
                "headers": list(headers),
                "client": ("127.0.0.1", 1),
                "server": ("127.0.0.1", 2),
                "state": {},
            }
            await app(scope, receive, send)
            if sent[0]["status"] != 201:
                raise RuntimeError(f"create answered {sent}")

        async def connection(n: int) -> None:
            for _ in range(n):
                await one()

        await asyncio.gather(*(connection(20) for _ in range(args.concurrency)))  # warm up
        out: list[float] = []
        total = args.creates * args.concurrency
        for r in range(args.rounds + (1 if args.profile else 0)):
            prof = cProfile.Profile() if args.profile and r == args.rounds else None
            if prof is not None:
                prof.enable()
            cpu = time.process_time()
            await asyncio.gather(*(connection(args.creates) for _ in range(args.concurrency)))
            cpu = time.process_time() - cpu
            if prof is not None:
                prof.disable()
                prof.dump_stats(str(args.profile))
                continue
            out.append(round(cpu * 1e6 / total, 1))
            print(f"round {r + 1}: {out[-1]} us CPU per create", flush=True)
        return out
    finally:
        await engine.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--creates", type=int, default=100, help="per coroutine and round")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--profile", type=Path, help="cProfile one more round into this file")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="tw-bench-api-app-") as tmp,
        RedisServer(Path(tmp) / "redis", appendfsync="no") as server,
        asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner,
    ):
        rounds = runner.run(measure(server.url, args))
    print(f"best {min(rounds)} us CPU per create in the app layer", flush=True)
    out = {
        "bench": "api_app",
        "concurrency": args.concurrency,
        "creates_per_round": args.creates * args.concurrency,
        "cpu_us_per_create": rounds,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
