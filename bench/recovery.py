"""Recovery: snapshot and restore at size, the time back to dispatching, the archiver's lag.

The servers are what `timewheel dev` runs: redis-server with `appendfsync always`
(timewheel/store/server.py) and a PostgreSQL with fsync on (timewheel/archive/server.py,
initdb in a temp dir), 64 shards, 100-byte payloads.

a. snapshot: --tasks pending tasks (1,000 tenants, due uniformly over the next 7 days)
   are loaded through lua/task_create.lua with the calls Engine builds, streamed on a
   plain pipelined connection (bench/memory.py's loader), plus 1,000 probe tasks of one
   tenant due 1 s after the load. `take_snapshot` copies them into PostgreSQL. Figures:
   seconds and rows/s.
b. restore and RTO: the loaded redis-server is stopped and a new, empty one started (the
   AOF is gone). t0 is when it answers. `restore` rebuilds it (seconds, runs/s); then a
   `timewheel scheduler` process starts, and the first probe run in its ready stream
   ends the recovery: RTO = t0 to that run (restore + scheduler start + first tick).
c. archiver lag: a fresh redis-server and database, `timewheel archiver` as its own
   process (defaults: batch 1000, poll 100 ms), and creates at --rate/s (4 callers, each
   a batch every 10 ms) for --seconds. Every 100 ms the bench samples how many acknowledged creates
   PostgreSQL does not hold yet (lag in entries); each row's archived_at minus its
   event's stream id time is its lag in seconds. Figures: p50, p99, max of both: the
   window of acknowledged work that only Redis (its AOF) holds.

The machine is shared (2 cores, other work): the figures are indicative.

Run:  .venv/bin/python bench/recovery.py                    (1,000,000 tasks; ~6 min)
      .venv/bin/python bench/recovery.py --tasks 200000     (smaller)
      .venv/bin/python bench/recovery.py --tasks 20000 --seconds 10 --out /tmp/r.json
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

import psycopg
import redis.asyncio as aioredis
from common import percentile, scheduler_process
from durability import count_rows
from memory import Workload, _create_raw, load_raw, tenant_names

from timewheel import ids
from timewheel.archive import pg
from timewheel.archive.restore import restore
from timewheel.archive.server import LocalPostgres
from timewheel.archive.snapshot import take_snapshot
from timewheel.config import Settings
from timewheel.engine import Engine
from timewheel.store.server import RedisServer
from timewheel.tasks.model import NewTask

RESULTS = Path(__file__).resolve().parent / "results" / "recovery.json"
SHARDS = 64
TENANTS = 1000
PROBE_TENANT = "rto-probe"
PROBES = 1000
PAYLOAD = '"' + "x" * 98 + '"'  # 100 bytes of JSON
LOAD_BATCH = 2000
RTO_TIMEOUT_S = 120.0
LAG_SAMPLE_S = 0.1
HOUR_MS = 3_600_000
LOAD_CALLERS = 4


def _settings(url: str, dsn: str) -> Settings:
    return Settings(redis_url=url, shards=SHARDS, postgres_dsn=dsn)


async def load_pending(settings: Settings, tasks: int) -> float:
    """Load `tasks` far-future tasks and PROBES probes due 1 s later; the load's seconds."""
    engine = await Engine.connect(settings)
    try:
        await engine.store.scripts.library.load(engine.client)  # pipelines do not load it
        work = Workload(tasks, tenant_names(TENANTS), int(time.time() * 1000), near=False)
        started = time.perf_counter()
        await load_raw(settings.redis_url, _create_raw(engine, work, LOAD_BATCH))
        due = int(time.time() * 1000) + 1000
        probes = [NewTask(tenant=PROBE_TENANT, payload_json=PAYLOAD, run_at_ms=due)] * PROBES
        await engine.tasks.create_many(probes)
        return time.perf_counter() - started
    finally:
        await engine.close()


async def snapshot(settings: Settings) -> dict[str, Any]:
    engine = await Engine.connect(settings)
    try:
        async with pg.connection(settings.postgres_dsn) as conn:
            await pg.migrate(conn)
            started = time.perf_counter()
            result = await take_snapshot(engine.store, conn)
            seconds = time.perf_counter() - started
    finally:
        await engine.close()
    return {
        "snapshot_s": round(seconds, 2),
        "rows": result.tasks,
        "rows_per_s": round(result.tasks / seconds),
    }


async def restore_and_rto(settings: Settings, server: RedisServer, root: Path) -> dict[str, Any]:
    """Restore into the (empty, answering) `server`, then start a scheduler; t0 = now."""
    t0 = time.perf_counter()
    result = await restore(settings)
    restore_s = time.perf_counter() - t0
    log = root / "scheduler.log"
    proc = scheduler_process(settings, "rto", log)
    shard = ids.tenant_shards(PROBE_TENANT, settings.default_spread, SHARDS)[0]
    stream = f"{{{settings.prefix}:{shard}}}:q:{PROBE_TENANT}:{settings.default_queue}"
    client = aioredis.Redis.from_url(server.url)
    try:
        deadline = time.monotonic() + RTO_TIMEOUT_S
        while not await client.xlen(stream):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"no probe run dispatched:\n{log.read_text()[-2000:]}")
            await asyncio.sleep(0.005)
        rto_s = time.perf_counter() - t0
    finally:
        await client.aclose()
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
    return {
        "restore_s": round(restore_s, 2),
        "restored": result.restored,
        "restore_rows_per_s": round(result.restored / restore_s),
        "events_replayed": result.events_replayed,
        "first_dispatch_after_restore_s": round(rto_s - restore_s, 2),
        "rto_s": round(rto_s, 2),
    }


async def load_at_rate(engine: Engine, rate: int, seconds: float, acked: list[int]) -> None:
    """Create at `rate`/s from LOAD_CALLERS callers, each a batch every 10 ms (open loop:
    a late batch is a bigger one), so one caller's wait for Redis's fsync overlaps the
    others' work; acked[0] counts the creates answered."""
    started = time.perf_counter()
    share = rate / LOAD_CALLERS

    async def caller(n: int) -> None:
        done = 0
        while (elapsed := time.perf_counter() - started) < seconds:
            want = int(share * elapsed) - done
            if want > 0:
                batch = [
                    NewTask(tenant=f"t{(n + i) % 100}", payload_json=PAYLOAD, delay_ms=HOUR_MS)
                    for i in range(min(want, 1000))
                ]
                await engine.tasks.create_many(batch)
                done += len(batch)
                acked[0] += len(batch)
            await asyncio.sleep(0.01)

    await asyncio.gather(*(caller(n) for n in range(LOAD_CALLERS)))


async def archiver_lag(rate: int, seconds: float, root: Path) -> dict[str, Any]:
    server = RedisServer(root / "redis-lag")
    postgres = LocalPostgres(root / "postgres-lag")
    server.start()
    proc: subprocess.Popen[bytes] | None = None
    try:
        postgres.start()
        dsn = postgres.dsn()
        engine = await Engine.connect(_settings(server.url, dsn))
        env = {**os.environ, "TIMEWHEEL_SHARDS": str(SHARDS), "PYTHONUNBUFFERED": "1"}
        log = root / "archiver.log"
        command = [sys.executable, "-m", "timewheel.cli", "archiver"]
        command += ["--postgres-dsn", dsn, "--redis-url", server.url]
        with log.open("wb") as out:
            proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while "archiver_started" not in log.read_text():
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"archiver did not start:\n{log.read_text()}")
            await asyncio.sleep(0.05)
        acked = [0]  # creates answered so far
        behind: list[int] = []

        async def sample(done: asyncio.Event) -> None:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                while not done.is_set():
                    cur = await conn.execute("SELECT count(*) FROM run_events")
                    row = await cur.fetchone()
                    # Answered creates read after the count: if anything, an overestimate
                    # (by the creates answered while the count ran, a batch or two).
                    behind.append(max(0, acked[0] - (int(str(row[0])) if row else 0)))
                    await asyncio.sleep(LAG_SAMPLE_S)

        done = asyncio.Event()
        sampler = asyncio.create_task(sample(done))
        started = time.perf_counter()
        try:
            await load_at_rate(engine, rate, seconds, acked)
        finally:
            done.set()
            await sampler
        achieved = acked[0] / (time.perf_counter() - started)
        deadline = time.monotonic() + 120
        while (rows := await count_rows(dsn)) < acked[0] and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await engine.close()
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            cur = await conn.execute(
                "SELECT extract(epoch FROM archived_at) * 1000 - id_ms FROM run_events"
                " WHERE kind = 'created' ORDER BY 1"
            )
            lags = [float(str(r[0])) for r in await cur.fetchall()]
        return {
            "rate": rate,
            "seconds": seconds,
            "achieved_rate": round(achieved),
            "events": acked[0],
            "archived": rows,
            "lag_p50_ms": round(percentile(lags, 50), 1),
            "lag_p99_ms": round(percentile(lags, 99), 1),
            "lag_max_ms": round(lags[-1], 1) if lags else None,
            "lag_entries_p50": round(percentile(behind, 50)),
            "lag_entries_p99": round(percentile(behind, 99)),
            "lag_entries_max": max(behind, default=0),
            "lag_samples": len(behind),
        }
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(20)
        postgres.stop()
        server.stop()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tw-bench-recovery-") as tmp:
        root = Path(tmp)
        os.chmod(root, 0o755)  # the postgres OS user must reach it when run as root
        postgres = LocalPostgres(root / "postgres")
        loaded = RedisServer(root / "redis-loaded")
        loaded.start()
        try:
            postgres.start()
            settings = _settings(loaded.url, postgres.dsn())
            load_s = await load_pending(settings, args.tasks)
            print(
                f"loaded {args.tasks:,} pending tasks + {PROBES} probes in {load_s:.1f} s "
                f"({(args.tasks + PROBES) / load_s:,.0f}/s)",
                flush=True,
            )
            await asyncio.sleep(1.2)  # the probes are due
            a = await snapshot(settings)
            print(
                f"snapshot: {a['rows']:,} rows in {a['snapshot_s']} s ({a['rows_per_s']:,} rows/s)",
                flush=True,
            )
            loaded.stop()
            empty = RedisServer(root / "redis-empty")
            empty.start()
            try:
                b = await restore_and_rto(_settings(empty.url, postgres.dsn()), empty, root)
            finally:
                empty.stop()
            print(
                f"restore into an empty Redis: {b['restored']:,} runs in {b['restore_s']} s "
                f"({b['restore_rows_per_s']:,} rows/s); first dispatch "
                f"{b['first_dispatch_after_restore_s']} s later: RTO {b['rto_s']} s",
                flush=True,
            )
        finally:
            loaded.stop()
            postgres.stop()
        c = await archiver_lag(args.rate, args.seconds, root)
        print(
            f"archiver lag at {c['achieved_rate']:,} events/s for {c['seconds']:.0f} s: "
            f"p50 {c['lag_p50_ms']} ms / {c['lag_entries_p50']:,} entries, "
            f"p99 {c['lag_p99_ms']} ms / {c['lag_entries_p99']:,} entries, "
            f"max {c['lag_max_ms']} ms / {c['lag_entries_max']:,} entries; "
            f"{c['archived']:,}/{c['events']:,} archived",
            flush=True,
        )
    return {"load_s": round(load_s, 1), "snapshot": a, "restore": b, "archiver_lag": c}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1_000_000, help="pending tasks (a, b)")
    parser.add_argument("--rate", type=int, default=10_000, help="creates/s of part c")
    parser.add_argument("--seconds", type=float, default=30.0, help="load time of part c")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    started = time.perf_counter()
    results = asyncio.run(run(args))
    out = {
        "parameters": {
            "tasks": args.tasks,
            "probes": PROBES,
            "shards": SHARDS,
            "tenants": TENANTS,
            "payload_bytes": len(PAYLOAD),
            "rate": args.rate,
            "seconds": args.seconds,
            "redis": "appendfsync always",
            "postgres": "fsync on (timewheel/archive/server.py defaults)",
            "archiver": "defaults: archive_batch 1000, --poll-ms 100",
            "machine": "2 cores shared with other work; indicative figures",
            "wall_s": round(time.perf_counter() - started, 1),
        },
        **results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
