"""The tick's cost with and without backlog caps (max_backlog, lua/lib/park.lua), on a
fresh redis-server (appendfsync everysec), one shard, read off INFO commandstats (Redis
time of the FCALLs, not the client's round trips).

Per scenario: `--tenants` (100) tenants x 2 queues x `--per-queue` (250) runs, all due,
ticked with tick_batch 1,000 until none is due; then `--idle` (1,000) ticks with nothing
due (what a sweep pass costs). Scenarios:
  no_cap      tenant_max_backlog 0: no check at all
  default     tenant_max_backlog 1,000,000, never reached: one XLEN per stream per call
  capped      the default, and a fifth of the tenants capped at 100 with no reader: their
              runs past the cap are parked (the drain figure counts sent and parked runs);
              the idle ticks each check the parked pairs' streams

Run:  .venv/bin/python bench/backlog_cap.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from dispatch import on_fresh_server, plain, server_ms

from timewheel.dispatch.rates import DispatchRates
from timewheel.engine import Engine
from timewheel.tasks.model import NewTask
from timewheel.testing.settings import test_settings

RESULTS = Path(__file__).resolve().parent / "results" / "backlog_cap.json"
SHARD = 0
CAP = 100


async def fcall_usec(engine: Engine) -> tuple[int, int]:
    """FCALL calls and their Redis time (usec) since the last reset."""
    stats: dict[str, Any] = await plain(engine).info("commandstats")
    row = stats.get("cmdstat_fcall", {"calls": 0, "usec": 0})
    return int(row["calls"]), int(row["usec"])


async def scenario(url: str, name: str, args: argparse.Namespace) -> dict[str, Any]:
    default = 0 if name == "no_cap" else 1_000_000
    settings = test_settings(url, tenant_max_backlog=default, tick_batch=1000)
    engine = await Engine.connect(dataclasses.replace(settings, shards=1))
    try:
        tenants = [f"t{i:03d}" for i in range(args.tenants)]
        capped = tenants[: args.tenants // 5] if name == "capped" else []
        caps = DispatchRates.of(engine.store)
        for tenant in capped:
            await caps.put_cap(tenant, CAP)
        now = await server_ms(plain(engine))
        due = now - 60_000
        batch: list[NewTask] = []
        for i in range(args.per_queue):
            for tenant in tenants:
                for queue in ("a", "b"):
                    batch.append(NewTask(tenant=tenant, queue=queue, run_at_ms=due + i))
            if len(batch) >= 2000:
                await engine.tasks.create_many(batch)
                batch = []
        if batch:
            await engine.tasks.create_many(batch)
        await engine.dispatch.promote(SHARD, limit=5000, now_ms=now)
        while (await engine.dispatch.promote(SHARD, limit=5000, now_ms=now)).more:
            pass
        await plain(engine).config_resetstat()
        sent = consumed = 0
        res = None
        for _ in range(10_000):
            res = await engine.dispatch.tick(SHARD, now_ms=now)
            sent += res.dispatched
            consumed += res.consumed
            if res.consumed < 1000:
                break
        calls, usec = await fcall_usec(engine)
        await plain(engine).config_resetstat()
        for i in range(args.idle):
            await engine.dispatch.tick(SHARD, now_ms=now + 1 + i)
        idle_calls, idle_usec = await fcall_usec(engine)
        return {
            "runs": args.tenants * 2 * args.per_queue,
            "dispatched": sent,
            "parked": res.parked if res else 0,
            "parked_pairs": len(res.parked_pairs) if res else 0,
            "drain_calls": calls,
            "drain_us_per_run": round(usec / max(1, consumed), 2),
            "drain_us_per_call": round(usec / max(1, calls), 1),
            "idle_us_per_call": round(idle_usec / max(1, idle_calls), 1),
        }
    finally:
        await engine.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--per-queue", type=int, default=250, help="runs per tenant and queue")
    parser.add_argument("--idle", type=int, default=1000, help="ticks with nothing due")
    parser.add_argument("--quick", action="store_true", help="a fifth of the runs")
    parser.add_argument(
        "--scenarios", default="no_cap,default,capped", help="comma list, in the order run"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.per_queue //= 5
    out: dict[str, Any] = {"config": vars(args) | {"out": str(args.out)}}
    with tempfile.TemporaryDirectory() as root:
        for name in args.scenarios.split(","):

            def work(url: str, name: str = name) -> dict[str, Any]:
                return asyncio.run(scenario(url, name, args))

            out[name] = on_fresh_server(name, Path(root), "everysec", work)
            print(f"{name}: {json.dumps(out[name])}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
