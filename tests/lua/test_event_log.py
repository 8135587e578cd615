"""Each shard's event log on a real Redis: trimmed behind the archiver's checkpoint
only, capped without one, and read back as a run's history for its own tenant only."""

from __future__ import annotations

import asyncio
from typing import Any

from timewheel.archive.history import run_history
from timewheel.engine import Engine
from timewheel.tasks.model import NewTask
from timewheel.testing.settings import test_settings


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


async def test_the_cap_counts_runs_so_batched_entries_keep_no_more_runs_than_single_ones(
    standalone_url: str,
) -> None:
    """event_log_max 1,000: single creates keep about 1,000 entries of one run each; calls
    of 200 tasks keep entries naming about 1,000 runs, not 1,000 entries of 200 runs."""
    engine = await Engine.connect(test_settings(standalone_url, shards=1, event_log_max=1000))
    try:
        events = engine.keys.events(0)

        async def named() -> int:
            entries: Any = await engine.client.xrange(events)
            return sum(len(f[b"runs"].split(b",")) for _, f in entries if b"runs" in f)

        for _ in range(30):  # 6,000 tasks in calls of 200: each entry 8 KB, a node of its own
            await engine.tasks.create_many(
                [NewTask(tenant="a", delay_ms=60_000) for _ in range(200)]
            )
        assert 1000 <= await named() <= 1400
        one = [NewTask(tenant="a", delay_ms=60_000)]
        await asyncio.gather(*(engine.tasks.create_many(one) for _ in range(3000)))
        assert 1000 <= await engine.client.xlen(events) <= 1200  # single entries: as before
    finally:
        await engine.close()
