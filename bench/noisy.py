"""A noisy tenant against a quiet one (docs/benchmarks.md), on a fresh redis-server with
AOF appendfsync always, 64 shards, a `timewheel scheduler` process of its own.

Tenant A (noisy) at once: `--schedules` (1,000) per-second cron schedules; a herd of
`--herd` (500,000) runs due within one second at T0; `--fat` (1,000) tasks with
`--fat-bytes` (60,000-byte) payloads due across the same second (60 MB: payloads up to
a generous byte limit). Tenant B (quiet) shares A's shard and has a steady 1,000 runs/s
due from T0 - 5 s to T0 + `--after` (15) s, created ahead by this process at 1,000/s
while A's load and A's schedules run.

Figures: B's lag (dispatched_ms - due_ms, both Redis time, read off the envelopes) p50,
p99 and max (target p99 <= 100 ms); A's herd: drain time after T0 and runs/s; A's
schedule runs: lag p99 and fire times seen against expected; duplicates and missing.

Run:  .venv/bin/python bench/noisy.py            (the full sizes)
      .venv/bin/python bench/noisy.py --quick    (a tenth of the herd: smoke run)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from common import percentile, scheduler_process
from dispatch import (
    SHARDS,
    load_scripts,
    on_fresh_server,
    plain,
    read_dispatches,
    server_ms,
)
from rawpipe import RawPipe, create_commands

from timewheel.config import Settings
from timewheel.engine import Engine
from timewheel.ids import tenant_shards
from timewheel.schedules.model import NewSchedule
from timewheel.schedules.spec import ScheduleSpec
from timewheel.tasks.model import NewTask

RESULTS = Path(__file__).resolve().parent / "results" / "noisy.json"
QUIET_P99_TARGET_MS = 100
QUIET_RATE = 1_000
"""B's runs per second."""
BEFORE_S = 5
LOAD_BATCH = 2_000
CALIBRATION = 20_000
"""Runs loaded first to measure this host's create rate, which sets T0."""
NOISY = "noisy"


def quiet_name() -> str:
    """A tenant name in the noisy tenant's shard (spread 1): the worst case for B."""
    target = tenant_shards(NOISY, 1, SHARDS)
    return next(
        name
        for name in (f"quiet-{i}" for i in range(10_000))
        if tenant_shards(name, 1, SHARDS) == target
    )


async def load_raw(url: str, engine: Engine, tasks: list[NewTask]) -> list[str]:
    ids: list[str] = []

    def batches() -> Any:
        for start in range(0, len(tasks), LOAD_BATCH):
            commands, made = create_commands(engine, tasks[start : start + LOAD_BATCH])
            ids.extend(made)
            yield commands

    pipe = await RawPipe.open(url)
    try:
        await pipe.run(batches())
    finally:
        await pipe.close()
    return ids


async def steady_quiet(engine: Engine, quiet: str, first_ms: int, count: int) -> list[str]:
    """B's runs due every 1/QUIET_RATE s from first_ms, created at QUIET_RATE a second,
    each at least 2 s before it is due."""
    ids: list[str] = []
    step = 1000 // QUIET_RATE
    per_tick = QUIET_RATE // 10
    for low in range(0, count, per_tick):
        made = await engine.tasks.create_many(
            [
                NewTask(tenant=quiet, payload_json='{"b":1}', run_at_ms=first_ms + step * i)
                for i in range(low, min(count, low + per_tick))
            ]
        )
        ids.extend(r.task_id for r in made)
        await asyncio.sleep(0.1)
    return ids


def lag_figures(runs: list[tuple[str, int, int]]) -> dict[str, Any]:
    lags = sorted(sent - due for _, due, sent in runs)
    return {
        "count": len(runs),
        "p50_ms": percentile(lags, 50),
        "p99_ms": percentile(lags, 99),
        "max_ms": lags[-1] if lags else None,
    }


async def part(url: str, args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    settings = Settings(redis_url=url, shards=SHARDS)
    engine = await Engine.connect(settings)
    await load_scripts(engine)
    client = plain(engine)
    quiet = quiet_name()
    proc = scheduler_process(settings, "noisy-bench", log_dir / "scheduler.log")
    try:
        await asyncio.sleep(1.0)  # leases taken, first promote done
        started = time.perf_counter()
        for low in range(0, args.schedules, 100):
            await asyncio.gather(
                *(
                    engine.schedules.create(
                        NewSchedule(tenant=NOISY, spec=ScheduleSpec(cron="* * * * * *"))
                    )
                    for _ in range(low, min(args.schedules, low + 100))
                )
            )
        schedules_s = time.perf_counter() - started
        # The load rate of this host now (a tenant of its own, due in a day): T0 is then
        # set for the herd's load to end well before it.
        now0 = await server_ms(client)
        calibrate = time.perf_counter()
        await load_raw(
            url,
            engine,
            [
                NewTask(
                    tenant="calibration", payload_json='{"a":1}', run_at_ms=now0 + 86_400_000 + i
                )
                for i in range(CALIBRATION)
            ],
        )
        rate = CALIBRATION / (time.perf_counter() - calibrate)
        now = await server_ms(client)
        lead_ms = int((args.herd + args.fat) / rate * 2500) + 4_000 + BEFORE_S * 1000
        t0 = now + lead_ms - (now + lead_ms) % 1000
        window_start = t0 - BEFORE_S * 1000
        quiet_count = (BEFORE_S + args.after) * QUIET_RATE
        # B is created steadily, beginning before A's load, from 2 s ahead of its runs.
        quiet_task = asyncio.create_task(steady_quiet(engine, quiet, window_start, quiet_count))
        herd = [
            NewTask(tenant=NOISY, queue="herd", payload_json='{"a":1}', run_at_ms=t0 + i % 1000)
            for i in range(args.herd)
        ]
        fat_payload = json.dumps("x" * (args.fat_bytes - 2))
        fat = [
            NewTask(tenant=NOISY, queue="herd", payload_json=fat_payload, run_at_ms=t0 + i % 1000)
            for i in range(args.fat)
        ]
        load_started = time.perf_counter()
        herd_ids = await load_raw(url, engine, herd + fat)
        load_s = time.perf_counter() - load_started
        if await server_ms(client) >= t0:
            raise RuntimeError(
                f"A's load took {load_s:.1f} s at a calibrated {rate:,.0f}/s, past T0"
            )
        quiet_ids = await quiet_task
        end_ms = window_start + quiet_count + 3_000
        while await server_ms(client) < end_ms:
            await asyncio.sleep(0.2)
        # Then until A's herd is all out (bounded by --timeout).
        deadline = time.monotonic() + args.timeout
        herd_stream = engine.keys.stream(engine.store.shards_of(NOISY)[0], NOISY, "herd")
        while await client.xlen(herd_stream) < len(herd_ids) and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        if proc.poll() is not None:
            raise RuntimeError("the scheduler process stopped early")
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    dispatches = await read_dispatches(client)
    persistence = await client.info("persistence")
    stats = await client.info("stats")
    await engine.close()

    quiet_set, herd_set = set(quiet_ids), set(herd_ids)
    seen = Counter(run_id for run_id, _, _ in dispatches)
    quiet_runs = [d for d in dispatches if d[0] in quiet_set]
    herd_runs = [d for d in dispatches if d[0] in herd_set]
    sched_runs = [d for d in dispatches if "@" in d[0] and t0 - 4_000 <= d[1] <= end_ms - 4_000]
    herd_end = max((sent for _, _, sent in herd_runs), default=t0)
    expected_fires = args.schedules * ((end_ms - 4_000) // 1000 - (t0 - 4_000 - 1) // 1000)
    quiet_fig = lag_figures(quiet_runs)
    during = [d for d in quiet_runs if t0 <= d[1] <= herd_end]
    quiet_fig["during_herd"] = lag_figures(during)
    quiet_fig["outside_herd"] = lag_figures([d for d in quiet_runs if not t0 <= d[1] <= herd_end])
    out: dict[str, Any] = {
        "shards": SHARDS,
        "quiet": {
            **quiet_fig,
            "rate_per_s": QUIET_RATE,
            "created": len(quiet_ids),
            "missing": len(quiet_set - seen.keys()),
        },
        "noisy_herd": {
            "runs": len(herd_ids),
            "fat_runs": args.fat,
            "fat_payload_bytes": args.fat_bytes,
            "load_seconds": round(load_s, 2),
            "drained_ms_after_t0": herd_end - t0,
            "runs_per_s": round(len(herd_runs) / max(0.001, (herd_end - t0) / 1000)),
            "missing": len(herd_set - seen.keys()),
            **{f"lag_{k}": v for k, v in lag_figures(herd_runs).items() if k != "count"},
        },
        "noisy_schedules": {
            "schedules": args.schedules,
            "create_seconds": round(schedules_s, 2),
            "runs_in_window": len(sched_runs),
            "expected_in_window": expected_fires,
            **{f"lag_{k}": v for k, v in lag_figures(sched_runs).items() if k != "count"},
        },
        "duplicates": sum(n - 1 for n in seen.values() if n > 1),
        "redis": {
            "aof_rewrites": persistence.get("aof_rewrites"),
            "latest_fork_usec": stats.get("latest_fork_usec"),
        },
        "target_quiet_p99_ms": QUIET_P99_TARGET_MS,
    }
    out["met"] = (
        quiet_fig["p99_ms"] <= QUIET_P99_TARGET_MS
        and out["quiet"]["missing"] == 0
        and out["noisy_herd"]["missing"] == 0
        and out["duplicates"] == 0
    )
    return out


def summary(r: dict[str, Any]) -> str:
    q, h, s = r["quiet"], r["noisy_herd"], r["noisy_schedules"]
    return (
        f"SUMMARY noisy tenant: B's {q['count']:,} runs at {q['rate_per_s']:,}/s beside A's "
        f"{s['schedules']:,} per-second schedules and {h['runs']:,}-run herd "
        f"({h['fat_runs']:,} of {h['fat_payload_bytes']:,} B): B lag p50 {q['p50_ms']} ms, "
        f"p99 {q['p99_ms']} ms, max {q['max_ms']} ms; while A's herd drains p99 "
        f"{q['during_herd']['p99_ms']} ms (target p99 <= {QUIET_P99_TARGET_MS} "
        f"ms: {'met' if r['met'] else 'MISSED'}); A's herd drained {h['drained_ms_after_t0']:,} "
        f"ms after T0 ({h['runs_per_s']:,} runs/s); A's schedule runs {s['runs_in_window']:,} "
        f"of {s['expected_in_window']:,} expected, lag p99 {s['lag_p99_ms']} ms; duplicates "
        f"{r['duplicates']}, missing {q['missing'] + h['missing']}"
    )


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedules", type=int, default=1_000)
    parser.add_argument("--herd", type=int, default=500_000)
    parser.add_argument("--fat", type=int, default=1_000)
    parser.add_argument("--fat-bytes", type=int, default=60_000)
    parser.add_argument("--after", type=int, default=15, help="seconds of B after T0")
    parser.add_argument("--timeout", type=float, default=120.0, help="drain deadline, s")
    parser.add_argument("--quick", action="store_true", help="a tenth of the herd")
    parser.add_argument("--data-dir", type=Path, default=None, help="parent of server data dirs")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    args = parser.parse_args(argv)
    if args.quick:
        args.herd //= 10
        args.fat //= 10
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    root = args.data_dir or Path(tempfile.mkdtemp(prefix="tw-bench-noisy-"))
    print(f"noisy bench: fresh redis-server, AOF appendfsync always, {SHARDS} shards")
    try:
        result = on_fresh_server(
            "noisy", root, "always", lambda url: asyncio.run(part(url, args, root))
        )
    finally:
        if args.data_dir is None:
            shutil.rmtree(root, ignore_errors=True)
    print(summary(result), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if result["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
