"""Failover: 3 scheduler nodes, a steady 5,000 tasks/s, kill -9 of one node.

Prints the max and p99 dispatch lag (dispatched_ms - due_ms) of runs due in the 5 s after
the kill, the time until every shard had a live owner again, and checks that every run
was dispatched exactly once. Writes bench/results/failover.json.

Run:  .venv/bin/python bench/failover.py [--rate 5000] [--seconds 12] [--kill-at 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from common import dispatched_runs, percentile, scheduler_process

from timewheel.config import Settings
from timewheel.engine import Engine
from timewheel.store.server import RedisServer
from timewheel.tasks.model import NewTask

RESULTS = Path(__file__).resolve().parent / "results" / "failover.json"
SHARDS = 64
TTL_MS = 2000
NODES = ("n1", "n2", "n3")


def now_ms() -> int:
    return int(time.time() * 1000)


async def holders(engine: Engine) -> list[str | None]:
    pipe = engine.client.pipeline(transaction=False)
    for shard in range(SHARDS):
        pipe.get(engine.keys.lease(shard))
    raw: list[Any] = await pipe.execute()
    return [None if r is None else r.decode().rsplit("/", 1)[0] for r in raw]


async def run(args: argparse.Namespace, server: RedisServer, log_dir: Path) -> dict[str, Any]:
    settings = Settings(redis_url=server.url, prefix="fo", shards=SHARDS)
    engine = await Engine.connect(settings)
    procs = {
        n: scheduler_process(settings, n, log_dir / f"{n}.log", "--lease-ttl-ms", str(TTL_MS))
        for n in NODES
    }
    try:
        deadline = time.monotonic() + 20
        while set(await holders(engine)) != set(NODES):
            if time.monotonic() > deadline:
                raise SystemExit("nodes did not share the shards in 20 s")
            await asyncio.sleep(0.05)
        tenants = [f"tenant-{i:03d}" for i in range(200)]
        batch = max(1, args.rate // 100)
        created: list[str] = []
        killed_at = 0
        recovered_at = 0
        begin = time.monotonic()
        tick = 0
        while time.monotonic() - begin < args.seconds:
            tasks = [
                NewTask(
                    tenant=tenants[(tick * batch + i) % len(tenants)],
                    payload_json='"x"',
                    delay_ms=1000,
                )
                for i in range(batch)
            ]
            created.extend(r.task_id for r in await engine.tasks.create_many(tasks))
            tick += 1
            elapsed = time.monotonic() - begin
            if not killed_at and elapsed >= args.kill_at:
                procs["n2"].send_signal(signal.SIGKILL)
                killed_at = now_ms()
            if killed_at and not recovered_at:
                owners = await holders(engine)
                if None not in owners and "n2" not in owners:
                    recovered_at = now_ms()
            await asyncio.sleep(max(0.0, begin + tick * 0.01 - time.monotonic()))
        achieved = len(created) / (time.monotonic() - begin)
        wait_until = time.monotonic() + 20
        runs = await dispatched_runs(engine)
        while len(runs) < len(created) and time.monotonic() < wait_until:
            await asyncio.sleep(0.5)
            runs = await dispatched_runs(engine)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in procs.values():
            proc.wait(timeout=15)
        await engine.close()
    counts = Counter(r[0] for r in runs)
    window = [d - due for _, due, d in runs if killed_at <= due < killed_at + 5000]
    lags = [d - due for _, due, d in runs]
    return {
        "parameters": {
            "rate": args.rate,
            "seconds": args.seconds,
            "kill_at_s": args.kill_at,
            "nodes": len(NODES),
            "ttl_ms": TTL_MS,
            "shards": SHARDS,
            "appendfsync": "always",
        },
        "achieved_create_rate": round(achieved),
        "created": len(created),
        "dispatched": len(runs),
        "missing": len(set(created) - set(counts)),
        "duplicates": sum(1 for c in counts.values() if c > 1),
        "ownerless_ms": (recovered_at - killed_at) if recovered_at else None,
        "after_kill": {
            "runs": len(window),
            "p50_ms": percentile(window, 50),
            "p99_ms": percentile(window, 99),
            "max_ms": max(window, default=0),
        },
        "overall": {
            "p50_ms": percentile(lags, 50),
            "p99_ms": percentile(lags, 99),
            "max_ms": max(lags, default=0),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=5000, help="tasks created per second")
    parser.add_argument("--seconds", type=float, default=12.0, help="load duration")
    parser.add_argument("--kill-at", type=float, default=5.0, help="seconds into the load")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp) / "redis", appendfsync="always")
        (Path(tmp) / "redis").mkdir()
        server.start()
        try:
            result = asyncio.run(run(args, server, Path(tmp)))
        finally:
            server.stop()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    after = result["after_kill"]
    print(
        f"failover: kill -9 of 1 of 3 nodes at {args.rate}/s: shards ownerless for "
        f"{result['ownerless_ms']} ms (ttl {TTL_MS}); runs due in the 5 s after: "
        f"p99 {after['p99_ms']} ms, max {after['max_ms']} ms ({after['runs']} runs); "
        f"missing {result['missing']}, duplicates {result['duplicates']}"
    )


if __name__ == "__main__":
    main()
