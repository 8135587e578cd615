"""Executor throughput and end-to-end lag, on a fresh redis-server with AOF appendfsync always.

a. throughput: N runs (default 200,000) are created due now and dispatched into the ready
   streams first; then ONE Worker (this process, no-op handler, pipelined acks) drains
   them. Figure: acknowledged runs per second.
b. lag: a `timewheel scheduler` process and a load-generator process (this script, hidden
   sub-command) create 5,000 runs/s for 20 s, each due 1 s after its create; the worker in
   this process records due_ms -> handler start (local clock; same machine as Redis).
   Figures: p50, p99, max.

Run:  .venv/bin/python bench/worker.py [--runs 200000] [--rate 5000] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import percentile

from timewheel.config import Settings
from timewheel.engine import Engine
from timewheel.models import Delivery
from timewheel.runs.worker import Worker
from timewheel.store.server import RedisServer
from timewheel.tasks.model import NewTask

RESULTS = Path(__file__).resolve().parent / "results" / "worker.json"
SHARDS = 64
TENANT = "bench"


def settings_for(url: str) -> Settings:
    # One tenant spread over 16 shards: one worker reads 16 streams, as a heavy tenant would.
    return Settings(redis_url=url, prefix="wb", shards=SHARDS, default_spread=16)


async def throughput(url: str, runs: int, concurrency: int) -> dict[str, Any]:
    engine = await Engine.connect(settings_for(url))
    try:
        for shard in range(SHARDS):
            await engine.dispatch.promote(shard)
        for _ in range(0, runs, 5000):
            await engine.tasks.create_many([NewTask(tenant=TENANT, delay_ms=0)] * min(5000, runs))
        while sum([(await engine.dispatch.tick(s, limit=5000)).dispatched for s in range(SHARDS)]):
            pass
        worker = Worker(engine.store, TENANT, "default", concurrency=concurrency)

        async def noop(d: Delivery) -> None:
            return

        stop = asyncio.Event()
        start = time.perf_counter()
        task = asyncio.create_task(worker.run(noop, stop))
        deadline = time.monotonic() + 300
        while worker.handled < runs and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        elapsed = time.perf_counter() - start
        stop.set()
        await task
        return {
            "runs": runs,
            "acked": worker.handled,
            "seconds": round(elapsed, 2),
            "acks_per_s": round(worker.handled / elapsed),
            "concurrency": concurrency,
        }
    finally:
        await engine.close()


def load(url: str, rate: int, seconds: float) -> None:
    """The load generator: `rate` creates per second, a batch every 10 ms, due in 1 s."""

    async def main() -> None:
        engine = await Engine.connect(settings_for(url))
        batch = max(1, rate // 100)
        begin = time.monotonic()
        step = 0
        try:
            while time.monotonic() - begin < seconds:
                await engine.tasks.create_many([NewTask(tenant=TENANT, delay_ms=1000)] * batch)
                step += 1
                await asyncio.sleep(max(0.0, begin + step * 0.01 - time.monotonic()))
        finally:
            await engine.close()
        print(json.dumps({"created": step * batch, "seconds": time.monotonic() - begin}))

    asyncio.run(main())


async def lag(url: str, rate: int, seconds: float, log_dir: Path) -> dict[str, Any]:
    env = {
        **os.environ,
        "TIMEWHEEL_PREFIX": "wb",
        "TIMEWHEEL_SHARDS": str(SHARDS),
        "TIMEWHEEL_DEFAULT_SPREAD": "16",
    }
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "timewheel.cli", "scheduler", "--redis-url", url, "--log-json"],
        stdout=(log_dir / "scheduler.log").open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
    )
    engine = await Engine.connect(settings_for(url))
    lags: list[float] = []

    async def record(d: Delivery) -> None:
        lags.append(time.time() * 1000 - d.due_ms)

    worker = Worker(engine.store, TENANT, "default", concurrency=200)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(record, stop))
    try:
        await asyncio.sleep(1.5)  # the scheduler holds its shards
        gen = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "_load",
            "--url",
            url,
            "--rate",
            str(rate),
            "--seconds",
            str(seconds),
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await gen.communicate()
        created = json.loads(out.decode().strip().splitlines()[-1])["created"]
        deadline = time.monotonic() + 30
        while worker.handled < created and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
    finally:
        stop.set()
        await task
        scheduler.send_signal(signal.SIGTERM)
        scheduler.wait(15)
        await engine.close()
    return {
        "rate": rate,
        "seconds": seconds,
        "created": created,
        "handled": worker.handled,
        "p50_ms": round(percentile(lags, 50), 1),
        "p99_ms": round(percentile(lags, 99), 1),
        "max_ms": round(max(lags, default=0), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="?", default="all", choices=["all", "_load"])
    parser.add_argument("--url")
    parser.add_argument("--runs", type=int, default=200_000)
    parser.add_argument("--concurrency", type=int, default=500)
    parser.add_argument("--rate", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    if args.command == "_load":
        load(args.url, args.rate, args.seconds)
        return
    result: dict[str, Any] = {
        "parameters": {"shards": SHARDS, "spread": 16, "appendfsync": "always"}
    }
    with tempfile.TemporaryDirectory() as tmp:
        for part in ("throughput", "lag"):
            data = Path(tmp) / part
            data.mkdir()
            server = RedisServer(data, appendfsync="always")
            server.start()
            try:
                if part == "throughput":
                    result[part] = asyncio.run(throughput(server.url, args.runs, args.concurrency))
                else:
                    result[part] = asyncio.run(lag(server.url, args.rate, args.seconds, data))
            finally:
                server.stop()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    t, lg = result["throughput"], result["lag"]
    print(
        f"worker: {t['acks_per_s']} acks/s with a no-op handler ({t['acked']} runs, one "
        f"process); due -> handler start at {lg['rate']}/s: p50 {lg['p50_ms']} ms, "
        f"p99 {lg['p99_ms']} ms, max {lg['max_ms']} ms ({lg['handled']}/{lg['created']})"
    )


if __name__ == "__main__":
    main()
