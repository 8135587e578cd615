"""Body hashes at full-size density: a shard holding as many records as one of 64 shards
holds at 50,000,000 tasks (781,000), with the fixed 1,024 body hashes of earlier
versions and with body hashes that split (docs/design.md, "Body hashes that split").

Per layout, on a fresh redis-server (AOF appendfsync everysec, no automatic rewrite):
load N pending tasks (100-byte payloads, due over the next 7 days) into a deployment of
one shard through lua/task_create.lua, run the promoter once (as a scheduler does), then
make R runs due now and dispatch them with promote and tick calls in a loop (no
scheduler process: the figure is Redis's work).
Reported: load rate, used_memory per task, body hashes and records per hash, the
dispatch's runs/s, Redis's FCALL time per dispatched run (commandstats of the tick) and
the HGET time inside it. The fixed layout is what a deployment an older release made
keeps while that release's Function library is loaded (store/deployment.py), so it is
set up that way.
Layouts alternate, `--pairs` times, in one sitting.

    .venv/bin/python bench/bodies.py [--tasks 781250] [--runs 100000] [--pairs 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from memory import PAYLOAD_BYTES, payload_json

from timewheel.config import Settings
from timewheel.engine import Engine
from timewheel.store.keys import Keys
from timewheel.store.server import RedisServer
from timewheel.tasks.model import NewTask

RESULTS = Path(__file__).resolve().parent / "results" / "bodies.json"
DAY_MS = 86_400_000
BATCH = 500
OLD_LIBRARY = (
    "#!lua name=timewheel_000000000000\n"
    "redis.register_function('tw_000000000000_noop', function() return 1 end)\n"
)
"""Another release's library, loaded: the deployment keeps the fixed layout."""


async def info(client: aioredis.Redis, section: str) -> dict[str, Any]:
    out: dict[str, Any] = await client.info(section)
    return out


async def one(layout: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    server = RedisServer(
        root / f"{layout}-{time.time_ns()}",
        appendfsync="everysec",
        extra_config={"auto-aof-rewrite-percentage": "0"},
    )
    server.start()
    try:
        client = aioredis.Redis.from_url(server.url)
        settings = Settings(redis_url=server.url, shards=1, audit_interval_ms=0)
        if layout == "fixed":  # a deployment an older release made, and still runs on
            await client.function_load(OLD_LIBRARY)
            await client.hset(
                Keys().layout(), mapping={"shards": 1, "bucket_ms": settings.bucket_ms}
            )
        engine = await Engine.connect(settings)
        try:
            before = (await info(client, "memory"))["used_memory"]
            now = int(time.time() * 1000)
            t0 = time.perf_counter()
            for start in range(0, args.tasks, BATCH):
                n = min(BATCH, args.tasks - start)
                await engine.tasks.create_many(
                    [
                        NewTask(
                            tenant="acme",
                            run_at_ms=now + DAY_MS + (i * 7 * DAY_MS) // args.tasks,
                            payload_json=payload_json(i),
                        )
                        for i in range(start, start + n)
                    ]
                )
            load_s = time.perf_counter() - t0
            used = (await info(client, "memory"))["used_memory"] - before
            tag = Keys().tag(0)
            hashes = 0
            async for _ in client.scan_iter(match=tag + "t[0-9:]*", count=10_000):
                hashes += 1
            # A scheduler's promoter has run, as in a deployment: the runs made due now go
            # to the near level and the dispatch is the tick's work alone.
            while (await engine.dispatch.promote(0, limit=5000)).more:
                pass
            due = int(time.time() * 1000)
            for start in range(0, args.runs, BATCH):
                n = min(BATCH, args.runs - start)
                await engine.tasks.create_many(
                    [NewTask(tenant="acme", run_at_ms=due) for _ in range(n)]
                )
            await client.config_resetstat()
            t0 = time.perf_counter()
            sent = 0
            while sent < args.runs:
                while (await engine.dispatch.promote(0, limit=5000)).more:
                    pass
                sent += (await engine.dispatch.tick(0, limit=1000)).dispatched
                if time.perf_counter() - t0 > 600:
                    raise RuntimeError(f"dispatched {sent} of {args.runs} in 600 s")
            dispatch_s = time.perf_counter() - t0
            stats = await info(client, "commandstats")
            fcall = stats.get("cmdstat_fcall", {})
            hget = stats.get("cmdstat_hget", {})
            layout_now = await engine.store.body_layout(0)
        finally:
            await engine.close()
        await client.aclose()
    finally:
        server.stop()
    return {
        "layout": layout,
        "tasks": args.tasks,
        "load_s": round(load_s, 1),
        "load_per_s": round(args.tasks / load_s),
        "bytes_per_task": round(used / args.tasks, 1),
        "body_hashes": hashes,
        "records_per_hash": round((args.tasks + args.runs) / max(hashes, 1), 1),
        "body_bits": layout_now.bits,
        "body_split": layout_now.split,
        "runs": args.runs,
        "dispatch_s": round(dispatch_s, 2),
        "dispatch_per_s": round(args.runs / dispatch_s),
        "fcall_us_per_run": round(float(fcall.get("usec", 0)) / args.runs, 2),
        "hget_us_per_call": hget.get("usec_per_call"),
        "hget_calls": hget.get("calls"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=781_250, help="pending tasks in the shard")
    parser.add_argument("--runs", type=int, default=100_000, help="runs made due and dispatched")
    parser.add_argument("--pairs", type=int, default=2, help="fixed/split pairs, interleaved")
    parser.add_argument(
        "--layouts",
        default="fixed,split",
        help="comma list of fixed, split (split alone: to compare the code under PYTHONPATH "
        "against another checkout's, pair by pair)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    layouts = [name for name in args.layouts.split(",") if name]
    if not layouts or set(layouts) - {"fixed", "split"}:
        parser.error("--layouts takes fixed and/or split")
    root = Path(tempfile.mkdtemp(prefix="tw-bench-bodies-"))
    print(
        f"bodies bench: {args.tasks:,} pending tasks in one shard ({PAYLOAD_BYTES} B payloads), "
        f"{args.runs:,} runs dispatched; fixed 1,024 hashes against hashes that split, "
        f"{args.pairs} interleaved pairs",
        flush=True,
    )
    results = []
    for _ in range(args.pairs):
        for layout in layouts:
            r = asyncio.run(one(layout, args, root))
            results.append(r)
            print(
                f"  {layout:5}: load {r['load_per_s']:,}/s, {r['bytes_per_task']} B/task, "
                f"{r['body_hashes']:,} hashes of {r['records_per_hash']}; dispatch "
                f"{r['dispatch_per_s']:,} runs/s, FCALL {r['fcall_us_per_run']} us/run, "
                f"HGET {r['hget_us_per_call']} us",
                flush=True,
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {"parameters": {"tasks": args.tasks, "runs": args.runs}, "results": results},
            indent=1,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
