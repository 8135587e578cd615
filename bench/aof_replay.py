"""How long a Redis restart takes per GB: AOF replay before and after a rewrite.

One fresh redis-server (AOF on, automatic rewrites off so the AOF stays the log of every
write; `appendfsync everysec` to load quickly: the AOF's content, and so its replay, is
the same under `always`). N pending tasks (100-byte payloads, 64 shards, 1,000 tenants,
due uniformly over the next 7 days) are loaded with the calls the engine's batched
create makes. Then:

1. the server is stopped and started again: it replays the AOF (the effects of every
   create) before it answers PING; the figure is Redis's own "DB loaded from append only
   file" time, and the wall time from the start to the first PING answered;
2. BGREWRITEAOF: its time (INFO persistence aof_last_rewrite_time_sec, and wall time);
3. stopped and started again: it loads the rewritten AOF (an RDB image).

Each with the AOF's size on disk and `used_memory`, so the times read per GB.

Run:  .venv/bin/python bench/aof_replay.py              (1,000,000 tasks)
      .venv/bin/python bench/aof_replay.py --quick      (200,000 tasks)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis
from rawpipe import RawPipe, create_commands

from timewheel.config import Settings
from timewheel.engine import Engine
from timewheel.store.server import RedisServer
from timewheel.tasks.model import NewTask

RESULTS = Path(__file__).resolve().parent / "results" / "aof_replay.json"
SHARDS = 64
TENANTS = 1000
PAYLOAD_BYTES = 100
SPREAD_MS = 7 * 24 * 3600 * 1000
LOADED = re.compile(r"DB loaded from append only file: ([0-9.]+) seconds")
_PAD = "x" * (PAYLOAD_BYTES - len('"task-0000000000-"'))


def aof_bytes(data_dir: Path) -> int:
    """Bytes of every file of the AOF (Redis 7: appendonlydir/, base + incr + manifest)."""
    return sum(p.stat().st_size for p in (data_dir / "appendonlydir").glob("*") if p.is_file())


def load_seconds(log: str) -> float:
    """Redis's own load time in this start's part of the log (it also logs the base and
    incr files apart; this is their total)."""
    found = LOADED.findall(log)
    if not found:
        raise RuntimeError(f"no AOF load time in the log:\n{log[-2000:]}")
    return float(found[-1])


async def load(url: str, tasks: int, batch: int) -> float:
    engine = await Engine.connect(Settings(redis_url=url, shards=SHARDS, audit_interval_ms=0))
    await engine.store.scripts.library.load(engine.client)
    rng = random.Random(1)
    now = int(time.time() * 1000)
    tenants = [f"tenant-{i:04d}" for i in range(TENANTS)]

    def batches() -> Iterator[list[bytes]]:
        for start in range(0, tasks, batch):
            news = [
                NewTask(
                    tenant=tenants[i % TENANTS],
                    payload_json=f'"task-{i:010d}-{_PAD}"',
                    run_at_ms=now + 600_000 + rng.randrange(SPREAD_MS),
                )
                for i in range(start, min(start + batch, tasks))
            ]
            yield create_commands(engine, news)[0]

    started = time.perf_counter()
    pipe = await RawPipe.open(url)
    try:
        await pipe.run(batches())
    finally:
        await pipe.close()
        await engine.close()
    return time.perf_counter() - started


def restart(server: RedisServer, timeout_s: float) -> dict[str, Any]:
    """Stop, start again; the replay's time by Redis's log and by the wall clock."""
    server.stop()
    before = server.log_path.read_text(errors="replace")
    started = time.perf_counter()
    server.start(timeout_s=timeout_s)
    wall = time.perf_counter() - started
    log = server.log_path.read_text(errors="replace")[len(before) :]
    return {"wall_s": round(wall, 3), "redis_load_s": load_seconds(log)}


def memory(client: redis.Redis) -> int:
    info: dict[str, Any] = client.info("memory")
    return int(info["used_memory"])


def rewrite(client: redis.Redis, timeout_s: float) -> dict[str, Any]:
    started = time.perf_counter()
    client.bgrewriteaof()
    deadline = time.monotonic() + timeout_s
    while True:
        time.sleep(0.1)
        info: dict[str, Any] = client.info("persistence")
        if not int(info["aof_rewrite_in_progress"]) and not int(info["aof_rewrite_scheduled"]):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"BGREWRITEAOF did not finish in {timeout_s} s")
    return {
        "wall_s": round(time.perf_counter() - started, 2),
        "redis_rewrite_s": int(info["aof_last_rewrite_time_sec"]),
        "status": info["aof_last_bgrewrite_status"],
    }


def gb(n: int) -> float:
    return round(n / 1e9, 3)


def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    server = RedisServer(
        root / "redis",
        port=0,
        appendfsync="everysec",
        extra_config={"auto-aof-rewrite-percentage": "0"},
    )
    server.start()
    try:
        load_s = asyncio.run(load(server.url, args.tasks, args.batch))
        print(f"  loaded {args.tasks:,} tasks in {load_s:.1f} s", flush=True)
        client = redis.Redis(host=server.host, port=server.port, socket_timeout=args.timeout)
        used = memory(client)
        client.close()
        log_aof = aof_bytes(server.data_dir)
        replay = restart(server, args.timeout)
        print(f"  AOF of {gb(log_aof)} GB replayed in {replay}", flush=True)
        client = redis.Redis(host=server.host, port=server.port, socket_timeout=args.timeout)
        used_after = memory(client)
        rewritten = rewrite(client, args.timeout)
        client.close()
        image_aof = aof_bytes(server.data_dir)
        print(f"  rewrite {rewritten}, AOF now {gb(image_aof)} GB", flush=True)
        reload = restart(server, args.timeout)
        print(f"  rewritten AOF loaded in {reload}", flush=True)
    finally:
        server.stop()

    def per_gb(seconds: float, size: int) -> float:
        return round(seconds / (size / 1e9), 2) if size else 0.0

    return {
        "load_s": round(load_s, 1),
        "used_memory_bytes": used,
        "used_memory_after_replay_bytes": used_after,
        "log_aof": {
            "bytes": log_aof,
            "bytes_per_task": round(log_aof / args.tasks, 1),
            **replay,
            "s_per_gb_aof": per_gb(replay["redis_load_s"], log_aof),
            "s_per_gb_used_memory": per_gb(replay["redis_load_s"], used),
        },
        "rewrite": {**rewritten, "s_per_gb_used_memory": per_gb(rewritten["wall_s"], used)},
        "rewritten_aof": {
            "bytes": image_aof,
            "bytes_per_task": round(image_aof / args.tasks, 1),
            **reload,
            "s_per_gb_aof": per_gb(reload["redis_load_s"], image_aof),
            "s_per_gb_used_memory": per_gb(reload["redis_load_s"], used),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help="200,000 tasks (smoke run)")
    parser.add_argument("--batch", type=int, default=2000, help="creates per load pipeline")
    parser.add_argument("--timeout", type=float, default=600.0, help="deadline per step, s")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.quick:
        args.tasks = 200_000
    if args.tasks < 1:
        parser.error("--tasks must be at least 1")
    root = Path(tempfile.mkdtemp(prefix="tw-bench-aof-"))
    started = time.perf_counter()
    try:
        result = run(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    r = result
    print(
        f"SUMMARY AOF replay: {args.tasks:,} tasks, used_memory {gb(r['used_memory_bytes'])} GB; "
        f"AOF of writes {gb(r['log_aof']['bytes'])} GB replayed in "
        f"{r['log_aof']['redis_load_s']} s ({r['log_aof']['s_per_gb_used_memory']} s per GB "
        f"of used_memory); BGREWRITEAOF {r['rewrite']['wall_s']} s; rewritten AOF "
        f"{gb(r['rewritten_aof']['bytes'])} GB loaded in {r['rewritten_aof']['redis_load_s']} s "
        f"({r['rewritten_aof']['s_per_gb_used_memory']} s per GB of used_memory)",
        flush=True,
    )
    out = {
        "parameters": {
            "tasks": args.tasks,
            "payload_bytes": PAYLOAD_BYTES,
            "shards": SHARDS,
            "tenants": TENANTS,
            "spread_days": 7,
            "appendfsync": "everysec (replay reads the same AOF as under always)",
            "auto_aof_rewrite": "off",
            "bench_seconds": round(time.perf_counter() - started, 1),
        },
        **result,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
