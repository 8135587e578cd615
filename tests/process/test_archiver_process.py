"""The `timewheel archiver` process killed with SIGKILL inside its batches: no event is
lost or stored twice in PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from timewheel.archive import pg
from timewheel.config import Settings
from timewheel.engine import Engine
from timewheel.tasks.model import NewTask
from timewheel.testing.archive import make_history, pg_rows, redis_rows

CLI = [sys.executable, "-m", "timewheel.cli"]


def _archiver(settings: Settings, dsn: str, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "TIMEWHEEL_REDIS_URL": settings.redis_url,
        "TIMEWHEEL_PREFIX": settings.prefix,
        "TIMEWHEEL_SHARDS": str(settings.shards),
        "TIMEWHEEL_BUCKET_MS": str(settings.bucket_ms),
        "TIMEWHEEL_ARCHIVE_BATCH": "7",
        "TIMEWHEEL_POSTGRES_DSN": dsn,
        "PYTHONUNBUFFERED": "1",
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [*CLI, "archiver", "--poll-ms", "5"], env=env, stdout=out, stderr=subprocess.STDOUT
        )


async def _in_transaction(watch: psycopg.AsyncConnection[Any]) -> bool:
    """Whether another session of this database has a transaction open (the archiver's)."""
    cur = await watch.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND pid <> pg_backend_pid() AND xact_start IS NOT NULL"
    )
    row = await cur.fetchone()
    return bool(row and int(str(row[0])))


async def _count(dsn: str) -> int:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute("SELECT count(*) FROM run_events")
        row = await cur.fetchone()
        return int(str(row[0])) if row else 0


async def test_sigkill_mid_batch_neither_loses_nor_doubles_an_event(
    engine_pg: tuple[Engine, str], tmp_path: Path
) -> None:
    engine, dsn = engine_pg
    log = tmp_path / "archiver.log"
    await make_history(engine, tasks=120)
    async with pg.connection(dsn) as conn:
        await pg.migrate(conn)  # so that the counts below can be read from the start
    kills = 0
    watch = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    proc = _archiver(engine.settings, dsn, log)
    try:
        for round_ in range(4):
            # Keep writing while the archiver works, so a kill finds it inside a batch:
            # one create call per task, so each is an entry of its own (a batch call
            # writes one 'created' entry per shard).
            await asyncio.gather(
                *(
                    engine.tasks.create_many(
                        [NewTask(tenant=f"t{i % 3}", payload_json=str(round_), delay_ms=60_000)]
                    )
                    for i in range(80)
                )
            )
            deadline = time.monotonic() + 30
            before = await _count(dsn)
            while await _count(dsn) == before or not await _in_transaction(watch):
                # Kill only while its transaction is open: rows written, not committed.
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                # More entries, so an archiver that caught up still has batches to run.
                await engine.tasks.create_many(
                    [NewTask(tenant="t0", payload_json=str(round_), delay_ms=60_000)]
                )
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            kills += 1
            proc = _archiver(engine.settings, dsn, log)
        expected = await redis_rows(engine)
        deadline = time.monotonic() + 60
        while await _count(dsn) < len(expected):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "archiver did not catch up"
            await asyncio.sleep(0.05)
        deadline = time.monotonic() + 30
        while "archiver_started" not in log.read_text():  # its SIGTERM handler is set
            assert time.monotonic() < deadline, log.read_text()
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)  # a double would show up as more rows than events
        assert kills == 4
        assert await pg_rows(dsn) == expected
    finally:
        await watch.close()
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(10) == 0, log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
