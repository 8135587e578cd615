"""Restore in process from a PostgreSQL snapshot: the event logs reopen past the
archiver checkpoint, and a forced restore on standalone and Cluster brings deleted runs
back."""

from __future__ import annotations

import time
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster

from timewheel.archive import pg
from timewheel.archive.restore import restore
from timewheel.archive.snapshot import take_snapshot
from timewheel.engine import Engine
from timewheel.errors import RestoreRefused, TaskNotFound
from timewheel.store.server import RedisServer
from timewheel.tasks.model import NewTask
from timewheel.testing.archive import archive_all
from timewheel.testing.settings import test_settings

HOUR_MS = 3_600_000


async def test_restore_opens_each_event_log_past_the_archiver_checkpoint(
    own_redis: RedisServer, postgres_dsn: str
) -> None:
    """A new server whose clock is behind the old one's must not write events the
    archiver would skip (it reads after its checkpoint)."""
    settings = test_settings(own_redis.url, postgres_dsn=postgres_dsn, shards=1)
    engine = await Engine.connect(settings)
    try:
        await engine.tasks.create_many([NewTask(tenant="a", delay_ms=HOUR_MS)])
        await archive_all(engine, postgres_dsn)
        async with pg.connection(postgres_dsn) as conn:
            await take_snapshot(engine.store, conn)
            ahead_ms = int(time.time() * 1000) + HOUR_MS  # the old server's clock, say
            await conn.execute(
                "UPDATE archive_checkpoints SET last_ms = %s, last_seq = 5", (ahead_ms,)
            )
            await conn.commit()
        await engine.client.flushall()
        await restore(settings)
        await engine.tasks.create_many([NewTask(tenant="a", delay_ms=HOUR_MS)])
        entries: Any = await engine.client.xrange(engine.keys.events(0))
        assert [e[1][b"e"] for e in entries] == [b"restored", b"created"]
        assert entries[0][0] == f"{ahead_ms}-6".encode()
        archiver = await archive_all(engine, postgres_dsn)
        assert archiver.archived_total == 2  # both read, none skipped
    finally:
        await engine.close()


async def test_forced_restore_on_standalone_and_cluster(engine: Engine, postgres_dsn: str) -> None:
    """The session's servers hold other tests' keys: only --force may write there, and the
    runs of this test's prefix, deleted, come back."""
    made = await engine.tasks.create_many(
        [NewTask(tenant=f"t{i % 4}", payload_json=str(i), delay_ms=HOUR_MS) for i in range(30)]
    )
    await archive_all(engine, postgres_dsn)
    async with pg.connection(postgres_dsn) as conn:
        await take_snapshot(engine.store, conn)
    settings = test_settings(
        engine.settings.redis_url, prefix=engine.settings.prefix, postgres_dsn=postgres_dsn
    )
    with pytest.raises(RestoreRefused, match="not empty"):
        await restore(settings)
    pattern = f"{{{engine.settings.prefix}:*"
    client = engine.client
    if isinstance(client, RedisCluster):
        for node in client.get_primaries():
            async for key in client.scan_iter(match=pattern, target_nodes=node):
                await client.delete(key)
    else:
        async for key in client.scan_iter(match=pattern):
            await client.delete(key)
    with pytest.raises(TaskNotFound):
        await engine.tasks.get("t0", made[0].task_id)
    result = await restore(settings, force=True)
    assert (result.restored, result.existing) == (30, 0)
    for i, r in enumerate(made):
        task = await engine.tasks.get(f"t{i % 4}", r.task_id)
        assert (task.state, task.payload_json) == ("scheduled", str(i))
