"""Durability costs: creates/s under appendfsync always vs everysec, and archiver lag.

a. creates: for each appendfsync setting, a fresh redis-server (AOF on, 64 shards) takes
   creates for a bounded time through Engine.create_many (batches of 100) and through
   Engine.create (one call each, 32 concurrent callers), 100-byte payloads, due in an
   hour. Figures: creates/s of each.
b. archiver lag: a fresh redis-server (appendfsync always) and a fresh PostgreSQL
   (timewheel/testing/postgres.py: initdb in a temp dir, fsync off, so this measures the archiver,
   not the disk), `timewheel archiver` as its own process with default settings
   (batch 1000, idle poll 100 ms), and a load of --rate creates/s (a batch every 10 ms)
   for --seconds. Each create writes one `created` event; lag = the row's archived_at
   (PostgreSQL clock_timestamp() as it was written, just before its commit) minus the
   event's stream id time (Redis clock; same machine). Figures: p50, p99, max; and that
   every event arrived exactly once.
c. snapshot and restore: --restore-tasks pending tasks (64 shards, 100-byte payloads)
   are created and archived; then `take_snapshot` runs, Redis is flushed and `restore`
   rebuilds it. Figures: seconds of each and runs/s, and that every task came back.

The machine is shared (2 cores, other engineers' work): runs are kept short (about
75 s in all by default) and the figures are indicative.

Run:  .venv/bin/python bench/durability.py       (a: 6 s per case; b: 5,000/s for 20 s; c: 100k)
      .venv/bin/python bench/durability.py --seconds 10 --create-seconds 3 --restore-tasks 20000
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.postgres

from common import percentile

from timewheel.archive import pg
from timewheel.archive.archiver import Archiver
from timewheel.archive.restore import restore
from timewheel.archive.snapshot import take_snapshot
from timewheel.config import Settings
from timewheel.engine import Engine
from timewheel.store.server import RedisServer
from timewheel.tasks.model import NewTask
from timewheel.testing.postgres import PostgresServer

RESULTS = Path(__file__).resolve().parent / "results" / "durability.json"
SHARDS = 64
PAYLOAD = '"' + "x" * 98 + '"'  # 100 bytes of JSON
HOUR_MS = 3_600_000


# -- a. creates/s per appendfsync ------------------------------------------------------


async def creates_batched(engine: Engine, seconds: float) -> float:
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        batch = [
            NewTask(tenant=f"t{(done + i) % 100}", payload_json=PAYLOAD, delay_ms=HOUR_MS)
            for i in range(100)
        ]
        await engine.tasks.create_many(batch)
        done += len(batch)
    return done / (time.perf_counter() - started)


async def creates_single(engine: Engine, seconds: float, callers: int = 32) -> float:
    started = time.perf_counter()
    counts = [0] * callers

    async def caller(n: int) -> None:
        while time.perf_counter() - started < seconds:
            await engine.tasks.create(
                NewTask(tenant=f"t{n}", payload_json=PAYLOAD, delay_ms=HOUR_MS)
            )
            counts[n] += 1

    await asyncio.gather(*(caller(n) for n in range(callers)))
    return sum(counts) / (time.perf_counter() - started)


async def creates(fsync: str, seconds: float, root: Path) -> dict[str, Any]:
    server = RedisServer(root / f"redis-{fsync}", appendfsync=fsync)
    server.start()
    try:
        engine = await Engine.connect(Settings(redis_url=server.url, shards=SHARDS))
        try:
            batched = await creates_batched(engine, seconds)
            single = await creates_single(engine, seconds)
        finally:
            await engine.close()
    finally:
        server.stop()
    return {"appendfsync": fsync, "batched_per_s": round(batched), "single_per_s": round(single)}


# -- b. archiver lag --------------------------------------------------------------------


async def load(engine: Engine, rate: int, seconds: float) -> int:
    """Create at `rate`/s, a batch every 10 ms (open loop: a late batch is a bigger one)."""
    created, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        want = int(rate * elapsed) - created
        if want > 0:
            batch = [
                NewTask(tenant=f"t{(created + i) % 100}", payload_json=PAYLOAD, delay_ms=HOUR_MS)
                for i in range(min(want, 2000))
            ]
            await engine.tasks.create_many(batch)
            created += len(batch)
        await asyncio.sleep(0.01)
    return created


async def count_rows(dsn: str) -> int:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        try:
            cur = await conn.execute("SELECT count(*) FROM run_events")
        except psycopg.errors.UndefinedTable:
            return 0
        row = await cur.fetchone()
        return int(str(row[0])) if row else 0


async def archiver_lag(rate: int, seconds: float, root: Path) -> dict[str, Any]:
    server = RedisServer(root / "redis-lag", appendfsync="always")
    pg_server = PostgresServer()
    server.start()
    pg_server.start()
    proc: subprocess.Popen[bytes] | None = None
    try:
        dsn = pg_server.create_database()
        engine = await Engine.connect(Settings(redis_url=server.url, shards=SHARDS))
        env = {**os.environ, "TIMEWHEEL_SHARDS": str(SHARDS), "PYTHONUNBUFFERED": "1"}
        log = root / "archiver.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "timewheel.cli",
                    "archiver",
                    "--postgres-dsn",
                    dsn,
                    "--redis-url",
                    server.url,
                ],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while "archiver_started" not in log.read_text():
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"archiver did not start:\n{log.read_text()}")
            await asyncio.sleep(0.05)
        try:
            started = time.perf_counter()
            created = await load(engine, rate, seconds)
            achieved = created / (time.perf_counter() - started)
        finally:
            await engine.close()
        deadline = time.monotonic() + 60
        while (rows := await count_rows(dsn)) < created and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            cur = await conn.execute(
                "SELECT extract(epoch FROM archived_at) * 1000 - id_ms FROM run_events"
                " WHERE kind = 'created' ORDER BY 1"
            )
            lags = [float(str(r[0])) for r in await cur.fetchall()]
            cur = await conn.execute(
                "SELECT count(*) - count(DISTINCT (shard, id_ms, id_seq, run_id)) FROM run_events"
            )
            dup_row = await cur.fetchone()
        return {
            "rate": rate,
            "seconds": seconds,
            "achieved_rate": round(achieved),
            "events": created,
            "archived": rows,
            "duplicates": int(str(dup_row[0])) if dup_row else -1,
            "lag_p50_ms": round(percentile(lags, 50), 1),
            "lag_p99_ms": round(percentile(lags, 99), 1),
            "lag_max_ms": round(lags[-1], 1) if lags else None,
        }
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)
        server.stop()
        pg_server.stop()


# -- c. snapshot and restore ------------------------------------------------------------


async def snapshot_restore(tasks: int, root: Path) -> dict[str, Any]:
    server = RedisServer(root / "redis-restore", appendfsync="always")
    pg_server = PostgresServer()
    server.start()
    pg_server.start()
    try:
        dsn = pg_server.create_database()
        settings = Settings(redis_url=server.url, shards=SHARDS, postgres_dsn=dsn)
        engine = await Engine.connect(settings)
        try:
            for start in range(0, tasks, 1000):
                await engine.tasks.create_many(
                    [
                        NewTask(tenant=f"t{i % 100}", payload_json=PAYLOAD, delay_ms=HOUR_MS + i)
                        for i in range(start, min(start + 1000, tasks))
                    ]
                )
            async with pg.connection(dsn) as conn:
                archiver = Archiver(engine.store, conn)
                await archiver.start()
                while await archiver.run_once():
                    pass
                started = time.perf_counter()
                snap = await take_snapshot(engine.store, conn)
                snapshot_s = time.perf_counter() - started
            await engine.client.flushall()
        finally:
            await engine.close()
        started = time.perf_counter()
        result = await restore(settings)
        restore_s = time.perf_counter() - started
        return {
            "tasks": tasks,
            "snapshot_s": round(snapshot_s, 2),
            "snapshot_per_s": round(snap.tasks / snapshot_s),
            "restore_s": round(restore_s, 2),
            "restore_per_s": round(result.restored / restore_s),
            "snapshotted": snap.tasks,
            "restored": result.restored,
        }
    finally:
        server.stop()
        pg_server.stop()


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--create-seconds", type=float, default=6.0, help="per case of part a")
    parser.add_argument("--rate", type=int, default=5000, help="events/s of part b")
    parser.add_argument("--seconds", type=float, default=20.0, help="load time of part b")
    parser.add_argument(
        "--restore-tasks", type=int, default=100_000, help="pending tasks of part c"
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tw-bench-durability-") as tmp:
        root = Path(tmp)
        a = [await creates(fsync, args.create_seconds, root) for fsync in ("always", "everysec")]
        for r in a:
            print(
                f"creates, appendfsync {r['appendfsync']:8}: {r['batched_per_s']:>7,}/s batched "
                f"(create_many x100), {r['single_per_s']:>6,}/s single (32 callers)",
                flush=True,
            )
        b = await archiver_lag(args.rate, args.seconds, root)
        print(
            f"archiver lag at {b['achieved_rate']:,} events/s for {b['seconds']:.0f} s: "
            f"p50 {b['lag_p50_ms']} ms, p99 {b['lag_p99_ms']} ms, max {b['lag_max_ms']} ms; "
            f"{b['archived']:,}/{b['events']:,} archived, {b['duplicates']} duplicates",
            flush=True,
        )
        c = await snapshot_restore(args.restore_tasks, root)
        print(
            f"snapshot of {c['snapshotted']:,} pending tasks: {c['snapshot_s']} s "
            f"({c['snapshot_per_s']:,}/s); restore: {c['restore_s']} s ({c['restore_per_s']:,}/s), "
            f"{c['restored']:,} back",
            flush=True,
        )
    return {"creates": a, "archiver_lag": b, "snapshot_restore": c}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    results = asyncio.run(run(args))
    out = {
        "parameters": {
            "shards": SHARDS,
            "payload_bytes": len(PAYLOAD),
            "create_seconds": args.create_seconds,
            "rate": args.rate,
            "seconds": args.seconds,
            "restore_tasks": args.restore_tasks,
            "archiver": "defaults: archive_batch 1000, --poll-ms 100",
            "machine": "2 cores shared with other work; indicative figures",
        },
        **results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
