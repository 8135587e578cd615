"""Redis memory per entry of a ready stream, by `stream-node-max-entries`.

A fresh redis-server per setting (the recommended config, AOF off: memory does not depend
on it); `--entries` envelopes as the tick writes them (8 fields, a 100-byte payload) are
added round-robin to `--streams` ready streams of 64 shards; the figure is `used_memory`
after minus before, divided by the entries. A run is in a ready stream from its dispatch
to its ack, so this is what a backlog of dispatched runs costs.

Run:  .venv/bin/python bench/stream_nodes.py [--sizes 100,16,8,4,2] [--entries 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from timewheel.store.server import RedisServer

RESULTS = Path(__file__).parent / "results" / "stream-nodes.json"
PAD = "x" * 84


def envelope(i: int, streams: int) -> tuple[str, dict[str, str]]:
    tenant = f"tenant-{i % streams:04d}"
    run_id = f"{i % 64:03x}1gy61ezez{i:04d}"[:16]
    return f"{{tw:{i % 64}}}:q:{tenant}:default", {
        "run_id": run_id,
        "task_id": run_id,
        "tenant": tenant,
        "queue": "default",
        "attempt": "1",
        "due_ms": "1796517615821",
        "dispatched_ms": "1796517615831",
        "payload": f'"task-{i:010d}-{PAD}"',
    }


async def fill(url: str, entries: int, streams: int) -> dict[str, Any]:
    client = aioredis.Redis.from_url(url)
    try:
        before = int((await client.info("memory"))["used_memory"])
        for start in range(0, entries, 2000):
            pipe = client.pipeline(transaction=False)
            for i in range(start, min(entries, start + 2000)):
                key, fields = envelope(i, streams)
                pipe.xadd(key, fields)  # type: ignore[arg-type]
            await pipe.execute()
        after = int((await client.info("memory"))["used_memory"])
        return {"bytes_per_entry": round((after - before) / entries, 1)}
    finally:
        await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,16,8,4,2")
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    out: dict[str, Any] = {"entries": args.entries, "streams": args.streams, "sizes": {}}
    for size in args.sizes.split(","):
        root = Path(tempfile.mkdtemp(prefix="tw-bench-streams-"))
        server = RedisServer(
            root / "redis", appendfsync="no", extra_config={"stream-node-max-entries": size}
        )
        server.start()
        try:
            result = asyncio.run(fill(server.url, args.entries, args.streams))
        finally:
            server.stop()
            shutil.rmtree(root, ignore_errors=True)
        out["sizes"][size] = result
        print(
            f"stream-node-max-entries {size}: {result['bytes_per_entry']} B per entry", flush=True
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
