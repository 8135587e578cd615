"""Recurring schedules: how many every-1-s schedules one scheduler process sustains.

For each count N (default 5,000, 10,000 and 15,000) on a fresh redis-server with AOF
appendfsync always: N schedules of `every 1 s` (100 tenants, 64 shards, 100-byte payload)
are created through Engine.create_schedule while ONE `timewheel scheduler` process runs.
After a 5 s warm-up, every fire time in the next WINDOW seconds (default 30) of every
schedule is looked up in the ready streams: a fire time with no run is a miss; lag is
dispatched_ms - due_ms (both from the Redis clock). Target: N >= 10,000 with p99 lag
under 100 ms and no miss.

CPU: the scheduler process (utime + stime from /proc) and redis-server (INFO cpu) over the
window, per schedule. The planner alone: one pass that extends all N schedules by a
horizon, timed in this process (Python) and in Redis (INFO cpu), per schedule planned.

Run:  .venv/bin/python bench/schedules.py                 (5k, 10k, 15k; 30 s each)
      .venv/bin/python bench/schedules.py --counts 2000 --window 10 --out /tmp/s.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from common import dispatched_runs, percentile, scheduler_process

from timewheel.config import Settings
from timewheel.engine import Engine
from timewheel.schedules.model import NewSchedule, spec_from_json
from timewheel.schedules.spec import ScheduleSpec, fire_times
from timewheel.store import deployment
from timewheel.store.server import RedisServer

SHARDS = 64
TENANTS = 100
WARMUP_S = 5.0
RESULTS = Path(__file__).resolve().parent / "results" / "schedules.json"
PAYLOAD = json.dumps({"pad": "x" * 88})  # 100 bytes as JSON text
CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


async def redis_cpu_s(engine: Engine) -> float:
    info: Any = await engine.client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def create_all(engine: Engine, count: int) -> float:
    started = time.perf_counter()
    spec = ScheduleSpec(every_s=1)
    for low in range(0, count, 500):
        await asyncio.gather(
            *(
                engine.schedules.create(
                    NewSchedule(tenant=f"t{i % TENANTS}", spec=spec, payload_json=PAYLOAD)
                )
                for i in range(low, min(count, low + 500))
            )
        )
    return time.perf_counter() - started


async def measure(server: RedisServer, count: int, window_s: float, log: Path) -> dict[str, Any]:
    settings = Settings(redis_url=server.url, prefix=f"s{count}", shards=SHARDS)
    engine = await Engine.connect(settings)
    try:
        await engine.client.flushall()
        await deployment.ensure_layout(
            engine.client, engine.settings, engine.store.scripts.library.name
        )
        # The scheduler runs first, as in a deployment: creates then place runs in the
        # near level it has promoted, and it dispatches while they are being made.
        proc = scheduler_process(settings, "bench", log)
        try:
            await asyncio.sleep(2.0)
            create_s = await create_all(engine, count)
            specs: dict[str, ScheduleSpec] = {}
            async for key in engine.client.scan_iter(
                match=f"{{{settings.prefix}:*}}:s:*", count=5000
            ):
                raw: Any = await engine.client.hget(key, "spec")
                specs[key.decode().rsplit(":", 1)[1]] = spec_from_json(raw.decode())
            await asyncio.sleep(WARMUP_S)
            start_ms = (int(time.time()) + 1) * 1000
            await engine.client.config_resetstat()
            cpu0, rcpu0 = proc_cpu_s(proc.pid), await redis_cpu_s(engine)
            await asyncio.sleep(window_s)
            cpu1, rcpu1 = proc_cpu_s(proc.pid), await redis_cpu_s(engine)
            stats: Any = await engine.client.info("commandstats")
            end_ms = start_ms + int(window_s * 1000) - 1000
            await asyncio.sleep(2.0)
        finally:
            proc.terminate()
            proc.wait(10)
        runs = {r: (due, sent) for r, due, sent in await dispatched_runs(engine)}
        expected = misses = 0
        lags: list[int] = []
        for sid, spec in specs.items():
            for fire in fire_times(spec, start_ms, end_ms):
                expected += 1
                got = runs.get(f"{sid}@{fire}")
                if got is None:
                    misses += 1
                else:
                    lags.append(got[1] - got[0])
        planner = await planner_pass(engine)
        top = sorted(stats.items(), key=lambda kv: -float(kv[1]["usec"]))[:8]
        return {
            "schedules": count,
            "create_s": round(create_s, 2),
            "window_s": window_s,
            "fire_times": expected,
            "misses": misses,
            "lag_ms": {
                "p50": percentile(lags, 50),
                "p99": percentile(lags, 99),
                "max": max(lags, default=0),
            },
            "scheduler_cpu_per_s": round((cpu1 - cpu0) / window_s, 3),
            "redis_cpu_per_s": round((rcpu1 - rcpu0) / window_s, 3),
            "scheduler_cpu_us_per_schedule_s": round((cpu1 - cpu0) / window_s / count * 1e6, 1),
            "planner": planner,
            "redis_commands_usec_per_s": {
                name.removeprefix("cmdstat_"): {
                    "usec_per_s": round(float(v["usec"]) / window_s),
                    "calls_per_s": round(float(v["calls"]) / window_s),
                }
                for name, v in top
            },
        }
    finally:
        await engine.close()


async def planner_pass(engine: Engine) -> dict[str, Any]:
    """Extend every schedule by one horizon at once, as if the clock jumped ahead."""
    ahead = time.time() * 1000 + engine.settings.plan_horizon_ms
    rcpu0, cpu0 = await redis_cpu_s(engine), time.process_time()
    planned = added = 0
    for shard in range(engine.settings.shards):
        while True:
            res = await engine.planner.plan(shard, clock_ms=ahead)
            planned += res.schedules
            added += res.added
            if not res.more:
                break
    rcpu, cpu = await redis_cpu_s(engine) - rcpu0, time.process_time() - cpu0
    return {
        "schedules_planned": planned,
        "runs_added": added,
        "python_us_per_schedule": round(cpu / max(planned, 1) * 1e6, 1),
        "redis_us_per_schedule": round(rcpu / max(planned, 1) * 1e6, 1),
        "redis_us_per_run": round(rcpu / max(added, 1) * 1e6, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[5000, 10000, 15000])
    parser.add_argument("--window", type=float, default=30.0, help="seconds measured per count")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "redis"
        data.mkdir()
        server = RedisServer(data, appendfsync="always")
        server.start()
        try:
            for count in args.counts:
                log = Path(os.environ.get("BENCH_LOG_DIR", tmp)) / f"scheduler-{count}.log"
                res = asyncio.run(measure(server, count, args.window, log))
                results.append(res)
                lag = res["lag_ms"]
                print(
                    f"{count:>6} every-1-s schedules: {res['fire_times']} fire times, "
                    f"{res['misses']} missed; lag p50 {lag['p50']} / p99 {lag['p99']} / "
                    f"max {lag['max']} ms; scheduler {res['scheduler_cpu_per_s']} core, "
                    f"redis {res['redis_cpu_per_s']} core; planner "
                    f"{res['planner']['python_us_per_schedule']} us Python + "
                    f"{res['planner']['redis_us_per_schedule']} us Redis per schedule"
                )
        finally:
            server.stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"counts": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
