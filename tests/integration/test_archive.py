"""Archiver in process: every event into PostgreSQL exactly once, migrations, snapshots,
restarts of Redis and PostgreSQL under it, and the history fallback. Real PostgreSQL
and redis-server (fixtures)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import psycopg

from timewheel.archive import pg
from timewheel.archive.archiver import Archiver
from timewheel.archive.history import run_history
from timewheel.archive.snapshot import take_snapshot
from timewheel.engine import Engine
from timewheel.errors import RedisUnavailable
from timewheel.runs.outcomes import Failure
from timewheel.store.server import RedisServer
from timewheel.store.shard import Store
from timewheel.tasks.model import NewTask
from timewheel.testing.archive import archive_all, make_history, pg_rows, redis_rows
from timewheel.testing.clock import NOW
from timewheel.testing.dispatch import all_deliveries, prime, tick_all
from timewheel.testing.settings import test_settings


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


async def test_batched_acks_and_retries_are_archived_a_row_per_run_beside_old_entries(
    engine_pg: tuple[Engine, str],
) -> None:
    engine, dsn = engine_pg
    await engine.tasks.create_many(
        [NewTask(tenant="t0", payload_json=str(i), run_at_ms=NOW + 100) for i in range(6)]
    )
    await prime(engine, NOW)
    assert await tick_all(engine, NOW + 1000) == 6
    d = await all_deliveries(engine)
    assert await engine.outcomes.ack_many(d[:3], "g", now_ms=NOW + 1100) == [True] * 3
    failures = [Failure(d[3], "E: three"), Failure(d[4], "E: four")]
    results = await engine.outcomes.fail_many(failures, "g", now_ms=NOW + 1100)
    assert [r.outcome for r in results] == ["retry", "retry"]
    # An entry as earlier versions wrote it, one run in fields of its own.
    shard = int(d[5].run_id[:3], 16)
    old = {"e": "acked", "id": d[5].run_id, "tenant": "t0", "attempt": 1, "at": NOW + 1200}
    await engine.client.xadd(engine.keys.events(shard), old)  # type: ignore[arg-type]
    await archive_all(engine, dsn)
    assert await pg_rows(dsn) == await redis_rows(engine)
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(
            "SELECT run_id, tenant, attempt, due_ms, error FROM run_events"
            " WHERE kind IN ('acked', 'retry_scheduled') ORDER BY run_id"
        )
        rows = {str(r[0]): tuple(r[1:]) for r in await cur.fetchall()}
        assert {x.run_id: rows[x.run_id] for x in d[:3]} == {
            x.run_id: ("t0", 1, None, None) for x in d[:3]
        }
        assert rows[d[3].run_id][:2] == ("t0", 1) and rows[d[3].run_id][3] == "E: three"
        assert rows[d[4].run_id][3] == "E: four" and rows[d[4].run_id][2] == results[1].due_ms
        assert rows[d[5].run_id] == ("t0", 1, None, None)
        cur = await conn.execute("SELECT run_id, state, last_error FROM tasks WHERE tenant = 't0'")
        tasks = {str(r[0]): (r[1], r[2]) for r in await cur.fetchall()}
    assert [tasks[x.run_id] for x in d] == [
        ("succeeded", None),
        ("succeeded", None),
        ("succeeded", None),
        ("scheduled", "E: three"),
        ("scheduled", "E: four"),
        ("succeeded", None),
    ]


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
        # 39 pending and the cancelled one (finished records are copied for restore).
        assert (result.tasks, result.schedules) == (40, 0)
        cur = await conn.execute(
            "SELECT count(*), count(DISTINCT shard) FROM snapshot_tasks WHERE snapshot_id = %s",
            (result.snapshot_id,),
        )
        row = await cur.fetchone()
        assert row is not None and row[0] == 40 and int(str(row[1])) >= 2


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
    kinds = [(r.run_id, [e.kind for e in r.events]) for r in in_redis]
    assert kinds == [(manual, ["created", "dispatched"])]
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
        (manual, ["created", "dispatched"]),
    ]
    no_pg = Store(
        engine.client, test_settings(engine.settings.redis_url, prefix=engine.settings.prefix)
    )
    assert [r.run_id for r in await schedule_history(no_pg, sched.id, sched.created_ms)] == [
        f"{sched.id}@7200000"
    ]


async def test_a_stopping_archiver_archives_what_is_left(engine_pg: tuple[Engine, str]) -> None:
    engine, dsn = engine_pg
    conn = await pg.connect(dsn)
    try:
        archiver = Archiver(engine.store, conn)
        await archiver.start()
        await make_history(engine, tasks=30)
        stop = asyncio.Event()
        stop.set()  # stopped before a single round: only the drain archives
        await archiver.run(stop, drain_s=30)
        assert await pg_rows(dsn) == await redis_rows(engine)
        await engine.tasks.create(NewTask("t0", delay_ms=3_600_000))
        await archiver.run(stop)  # no drain: the new event stays in the log only
        assert len(await pg_rows(dsn)) == len(await redis_rows(engine)) - 1
    finally:
        await archiver.conn.close()
