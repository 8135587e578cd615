"""Archiver: every event into PostgreSQL exactly once, trimming bounded by its checkpoint,
migrations, and the history fallback. Real PostgreSQL and redis-server (fixtures)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from timewheel.archive import pg
from timewheel.archive.archiver import Archiver
from timewheel.archive.history import run_history
from timewheel.archive.snapshot import take_snapshot
from timewheel.config import Settings
from timewheel.engine import Engine
from timewheel.errors import RedisUnavailable
from timewheel.store.server import RedisServer
from timewheel.store.shard import Store
from timewheel.tasks.model import NewTask
from timewheel.testing.archive import archive_all, make_history, pg_rows, redis_rows
from timewheel.testing.settings import test_settings

CLI = [sys.executable, "-m", "timewheel.cli"]


@pytest.fixture
async def engine_pg(standalone_url: str, postgres_dsn: str) -> AsyncIterator[tuple[Engine, str]]:
    eng = await Engine.connect(test_settings(standalone_url, postgres_dsn=postgres_dsn))
    try:
        yield eng, postgres_dsn
    finally:
        await eng.close()


async def test_migrations_ship_in_the_package_and_apply_once(postgres_dsn: str) -> None:
    shipped = pg.migrations()
    assert shipped[0].version == 1 and "CREATE TABLE run_events" in shipped[0].sql
    async with pg.connection(postgres_dsn) as conn:
        assert await pg.migrate(conn) == [m.version for m in shipped]
        assert await pg.migrate(conn) == []
        cur = await conn.execute("SELECT version FROM schema_migrations ORDER BY version")
        assert [int(str(r[0])) for r in await cur.fetchall()] == [m.version for m in shipped]


async def test_archiver_stores_each_event_once_with_payloads(
    engine_pg: tuple[Engine, str],
) -> None:
    engine, dsn = engine_pg
    ids = await make_history(engine)
    await archive_all(engine, dsn)
    expected = await redis_rows(engine)
    assert len(expected) > 100
    assert await pg_rows(dsn) == expected
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(
            "SELECT payload, state, tenant FROM tasks WHERE run_id = %s", (ids[0],)
        )
        assert await cur.fetchone() == ('{"n":0,"v":2}', "scheduled", "t0")
        cur = await conn.execute("SELECT state FROM tasks WHERE run_id = %s", (ids[30],))
        assert await cur.fetchone() == ("scheduled",)
        cur = await conn.execute(
            "SELECT count(*) FROM tasks WHERE state = 'cancelled' AND payload IS NOT NULL"
        )
        assert await cur.fetchone() == (15,)
        cur = await conn.execute("SELECT count(*) FROM tasks WHERE state = 'dispatched'")
        assert await cur.fetchone() == (10,)
    # Its checkpoint is in every shard's meta hash, where event_emit reads it.
    for shard in range(engine.settings.shards):
        mark = await engine.client.hget(engine.keys.meta(shard), "archived")
        assert mark is not None


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


async def test_event_log_trimming_never_passes_the_checkpoint(standalone_url: str) -> None:
    engine = await Engine.connect(test_settings(standalone_url, shards=1, event_log_max=100))
    try:
        events, meta = engine.keys.events(0), engine.keys.meta(0)

        async def log_entries(n: int) -> None:
            # One create call per task: each call writes one 'created' entry.
            one = [NewTask(tenant="a", delay_ms=60_000)]
            await asyncio.gather(*(engine.tasks.create_many(one) for _ in range(n)))

        await log_entries(1000)
        assert await engine.client.xlen(events) < 300  # no archiver: capped near 100
        first: Any = await engine.client.xrange(events, count=1)
        # The archiver has stored up to the oldest entry: nothing younger may go.
        await engine.client.hset(meta, mapping={"archived": first[0][0], "archive_cap": 5000})
        await log_entries(1000)
        still: Any = await engine.client.xrange(events, count=1)
        assert still[0][0] == first[0][0]
        assert await engine.client.xlen(events) > 1000
        # The checkpoint moves on: archived entries are trimmed (whole stream nodes).
        last: Any = await engine.client.xrevrange(events, count=1)
        await engine.client.hset(meta, "archived", last[0][0])
        await log_entries(10)
        assert await engine.client.xlen(events) < 200
        # The hard cap: an archiver gone for good cannot make the log grow without bound.
        await engine.client.hset(meta, mapping={"archived": "0-0", "archive_cap": 400})
        await log_entries(1000)
        assert await engine.client.xlen(events) < 600
    finally:
        await engine.close()


async def test_history_finds_a_run_in_a_batch_created_entry_for_its_tenant_only(
    standalone_engine: Engine,
) -> None:
    engine = standalone_engine
    made = await engine.tasks.create_many(
        [NewTask(tenant=("a", "b")[i % 2], delay_ms=60_000) for i in range(40)]
    )
    mine = made[0].task_id  # tenant a's, in an entry that names runs of b too
    assert [e.kind for e in await run_history(engine.store, "a", mine)] == ["created"]
    assert await run_history(engine.store, "b", mine) == []


async def test_history_falls_back_to_postgres_when_the_log_lost_it(
    engine_pg: tuple[Engine, str],
) -> None:
    engine, dsn = engine_pg
    [made] = await engine.tasks.create_many([NewTask(tenant="t0", delay_ms=60_000)])
    await engine.tasks.update("t0", made.task_id, delay_ms=120_000)
    await engine.tasks.cancel("t0", made.task_id)
    in_redis = await run_history(engine.store, "t0", made.task_id)
    assert [e.kind for e in in_redis] == ["created", "updated", "cancelled"]
    await archive_all(engine, dsn)
    shard = int(made.task_id[:3], 16)
    # Trimmed away (as the cap would, once archived), then one more event in Redis only.
    await engine.client.delete(engine.keys.events(shard))
    await engine.client.xadd(
        engine.keys.events(shard),
        {"e": "purged", "id": made.task_id, "tenant": "t0", "at": 1},
    )
    merged = await run_history(engine.store, "t0", made.task_id)
    assert [e.kind for e in merged] == ["created", "updated", "cancelled", "purged"]
    assert merged[:3] == in_redis
    assert await run_history(engine.store, "t1", made.task_id) == []  # another tenant sees none
    no_pg = Store(
        engine.client, test_settings(engine.settings.redis_url, prefix=engine.settings.prefix)
    )
    assert [e.kind for e in await run_history(no_pg, "t0", made.task_id)] == ["purged"]
    # PostgreSQL down: the answer is what Redis holds, not an error.
    down = Store(
        engine.client,
        test_settings(
            engine.settings.redis_url,
            prefix=engine.settings.prefix,
            postgres_dsn="postgresql://nobody@127.0.0.1:1/none",
        ),
    )
    assert [e.kind for e in await run_history(down, "t0", made.task_id)] == ["purged"]


async def test_archive_and_snapshot_on_standalone_and_cluster(
    engine: Engine, postgres_dsn: str
) -> None:
    made = await engine.tasks.create_many(
        [NewTask(tenant=f"t{i % 5}", payload_json=str(i), delay_ms=60_000) for i in range(40)]
    )
    await engine.tasks.cancel("t0", made[0].task_id)
    await archive_all(engine, postgres_dsn)
    assert await pg_rows(postgres_dsn) == await redis_rows(engine)
    async with pg.connection(postgres_dsn) as conn:
        result = await take_snapshot(engine.store, conn)
        assert (result.tasks, result.schedules) == (39, 0)
        cur = await conn.execute(
            "SELECT count(*), count(DISTINCT shard) FROM snapshot_tasks WHERE snapshot_id = %s",
            (result.snapshot_id,),
        )
        row = await cur.fetchone()
        assert row is not None and row[0] == 39 and int(str(row[1])) >= 2


async def test_archiver_run_takes_snapshots_every_interval(
    engine_pg: tuple[Engine, str],
) -> None:
    engine, dsn = engine_pg
    await engine.tasks.create_many([NewTask(tenant="t0", delay_ms=60_000) for _ in range(5)])
    stop = asyncio.Event()
    async with pg.connection(dsn) as conn:
        archiver = Archiver(engine.store, conn)
        await archiver.start()
        running = asyncio.create_task(
            archiver.run(stop, poll_interval_s=0.01, snapshot_every_s=0.1, dsn=dsn)
        )
        try:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as watch:
                deadline = time.monotonic() + 20
                while True:
                    cur = await watch.execute(
                        "SELECT count(*), min(tasks) FROM snapshots WHERE finished_at IS NOT NULL"
                    )
                    row = await cur.fetchone()
                    assert row is not None
                    if int(str(row[0])) >= 2:
                        break
                    assert time.monotonic() < deadline, "no periodic snapshot"
                    await asyncio.sleep(0.05)
                assert row[1] == 5
        finally:
            stop.set()
            await asyncio.wait_for(running, 10)
        assert archiver.archived_total == 1  # entries: one create call of one shard


async def test_archiver_rides_through_restarts_of_redis_and_postgres(
    tmp_path: Path, postgres_dsn: str
) -> None:
    server = RedisServer(tmp_path / "redis", appendfsync="always")
    server.start()
    engine = await Engine.connect(test_settings(server.url))
    stop = asyncio.Event()
    archiver = Archiver(engine.store, await pg.connect(postgres_dsn))
    await archiver.start()
    running = asyncio.create_task(archiver.run(stop, poll_interval_s=0.01, dsn=postgres_dsn))

    async def create(n: int) -> None:
        for _ in range(100):  # the first call after a restart may meet a dead connection
            try:
                await engine.tasks.create_many(
                    [NewTask(tenant="a", delay_ms=60_000) for _ in range(n)]
                )
                return
            except RedisUnavailable:
                await asyncio.sleep(0.05)
        raise AssertionError("Redis did not come back")

    async def caught_up() -> None:
        deadline = time.monotonic() + 30
        while await pg_rows(postgres_dsn) != await redis_rows(engine):
            assert not running.done(), running
            assert time.monotonic() < deadline, "archiver did not catch up"
            await asyncio.sleep(0.05)

    try:
        await create(20)
        await caught_up()
        server.stop()  # the archiver's next rounds fail until it is back
        await asyncio.sleep(0.3)
        server.start()
        await create(20)
        await caught_up()
        async with await psycopg.AsyncConnection.connect(postgres_dsn, autocommit=True) as c:
            await c.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        await create(20)
        await caught_up()
        assert len(await pg_rows(postgres_dsn)) == 60
    finally:
        stop.set()
        await asyncio.wait_for(running, 10)
        await archiver.conn.close()
        await engine.close()
        server.stop()


async def test_archiver_takes_a_snapshot_at_once_when_none_is_recent(
    engine_pg: tuple[Engine, str],
) -> None:
    engine, dsn = engine_pg
    await engine.tasks.create_many([NewTask(tenant="t0", delay_ms=60_000) for _ in range(3)])

    async def snapshots_after_run() -> int:
        stop = asyncio.Event()
        async with pg.connection(dsn) as conn:
            archiver = Archiver(engine.store, conn)
            await archiver.start()
            running = asyncio.create_task(
                archiver.run(stop, poll_interval_s=0.01, snapshot_every_s=3600, dsn=dsn)
            )
            try:
                deadline = time.monotonic() + 3  # bounded look: at once, or not at all
                while time.monotonic() < deadline and not await count():
                    await asyncio.sleep(0.05)
            finally:
                stop.set()
                await asyncio.wait_for(running, 10)
        return await count()

    async def count() -> int:
        async with await psycopg.AsyncConnection.connect(dsn) as watch:
            cur = await watch.execute("SELECT count(*) FROM snapshots")
            row = await cur.fetchone()
            return int(str(row[0])) if row else -1

    assert await snapshots_after_run() == 1  # none yet: one at start
    assert await snapshots_after_run() == 1  # a fresh one exists: the next waits an hour


async def test_schedule_history_falls_back_to_postgres_when_the_log_lost_it(
    engine_pg: tuple[Engine, str],
) -> None:
    from timewheel.archive.history import schedule_history
    from timewheel.schedules.model import NewSchedule
    from timewheel.schedules.spec import ScheduleSpec

    engine, dsn = engine_pg
    sched, _ = await engine.schedules.create(
        NewSchedule(tenant="t0", spec=ScheduleSpec(every_s=3600))
    )
    manual = await engine.schedules.trigger("t0", sched.id)
    for shard in range(engine.settings.shards):
        await engine.dispatch.promote(shard)
        await engine.dispatch.tick(shard)
    in_redis = await schedule_history(engine.store, sched.id, sched.created_ms)
    assert [(r.run_id, [e.kind for e in r.events]) for r in in_redis] == [(manual, ["dispatched"])]
    await archive_all(engine, dsn)
    shard = int(sched.id[:3], 16)
    # Trimmed away (as the cap would, once archived), then one more event in Redis only.
    await engine.client.delete(engine.keys.events(shard))
    await engine.client.xadd(
        engine.keys.events(shard),
        {"e": "skipped", "id": f"{sched.id}@7200000", "tenant": "t0", "at": 1, "due_ms": 7200000},
    )
    merged = await schedule_history(engine.store, sched.id, sched.created_ms)
    assert [(r.run_id, [e.kind for e in r.events]) for r in merged] == [
        (f"{sched.id}@7200000", ["skipped"]),
        (manual, ["dispatched"]),
    ]
    no_pg = Store(
        engine.client, test_settings(engine.settings.redis_url, prefix=engine.settings.prefix)
    )
    assert [r.run_id for r in await schedule_history(no_pg, sched.id, sched.created_ms)] == [
        f"{sched.id}@7200000"
    ]
