"""The archive in tests: a history of events made on purpose, an in-process archiver run
until it has caught up, and the events as Redis holds them and as PostgreSQL does."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg

from timewheel.archive import pg
from timewheel.archive.archiver import Archiver
from timewheel.archive.events import event_rows
from timewheel.engine import Engine
from timewheel.tasks.model import NewTask
from timewheel.testing.dispatch import running_scheduler


async def archive_all(engine: Engine, dsn: str) -> Archiver:
    """Run an in-process archiver until a round finds nothing new."""
    conn = await pg.connect(dsn)
    try:
        archiver = Archiver(engine.store, conn)
        await archiver.start()
        for _ in range(10_000):
            if await archiver.run_once() == 0:
                return archiver
        raise AssertionError("archiver never caught up")
    finally:
        await conn.close()


async def redis_rows(engine: Engine) -> list[tuple[int, int, int, str]]:
    """(shard, id_ms, id_seq, run_id) of every event in every shard's log, as archived."""
    out: list[tuple[int, int, int, str]] = []
    for shard in range(engine.settings.shards):
        entries: Any = await engine.client.xrange(engine.keys.events(shard))
        for entry_id, fields in entries:
            out.extend((r[0], r[1], r[2], r[3]) for r in event_rows(shard, entry_id, fields))
    return sorted(out)


async def pg_rows(dsn: str) -> list[tuple[int, int, int, str]]:
    """(shard, id_ms, id_seq, run_id) of every archived event."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute("SELECT shard, id_ms, id_seq, run_id FROM run_events")
        return sorted(
            (int(str(a)), int(str(b)), int(str(c)), str(d)) for a, b, c, d in await cur.fetchall()
        )


async def make_history(engine: Engine, *, tasks: int = 60) -> list[str]:
    """Creates (some dispatched by a real scheduler), updates and cancels; returns task ids."""
    created = await engine.tasks.create_many(
        [
            NewTask(tenant=f"t{i % 3}", payload_json=f'{{"n":{i}}}', delay_ms=3_600_000)
            for i in range(tasks)
        ]
    )
    ids = [r.task_id for r in created]
    for i, task_id in enumerate(ids[: tasks // 4]):
        await engine.tasks.update(f"t{i % 3}", task_id, payload_json=f'{{"n":{i},"v":2}}')
    for i, task_id in enumerate(ids[tasks // 4 : tasks // 2], start=tasks // 4):
        await engine.tasks.cancel(f"t{i % 3}", task_id)
    due_now = await engine.tasks.create_many(
        [NewTask(tenant="t0", payload_json="1", delay_ms=0) for _ in range(10)]
    )
    async with running_scheduler(engine):
        deadline = time.monotonic() + 20
        while True:
            states = [(await engine.tasks.get("t0", r.task_id)).state for r in due_now]
            if all(s == "dispatched" for s in states):
                break
            assert time.monotonic() < deadline, states
            await asyncio.sleep(0.05)
    return ids
