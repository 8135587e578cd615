"""Runs of a far bucket that the promoter drains in several calls (more than
promote_batch runs, as after a scheduler's downtime) are moved to the near level, and
sent, while promoted_until still lies before them. Such a sent run reads as dispatched
everywhere (lua/lib/record.lua record_sent, store/record.py is_sent), so its ack, fail
and reap take effect: none is mistaken for a stale outcome and lost."""

from __future__ import annotations

from timewheel.engine import Engine
from timewheel.runs.worker import Worker
from timewheel.tasks.model import NewTask
from timewheel.testing.clock import NOW
from timewheel.testing.dispatch import prime
from timewheel.testing.settings import test_settings

HERD = 1_100
"""Past 1,024 a bucket is a hashtable: the promoter drains it in HSCAN steps."""


async def test_runs_sent_ahead_of_promoted_until_are_acked_failed_and_read_as_dispatched(
    redis_url: str,
) -> None:
    engine = await Engine.connect(test_settings(redis_url, promote_batch=10))
    try:
        await prime(engine)
        due = NOW + 10_000
        created: list[str] = []
        for _ in range(HERD // 100):
            made = await engine.tasks.create_many(
                [
                    NewTask(tenant="acme", run_at_ms=due, options={"retry": {"max_attempts": 3}})
                    for _ in range(100)
                ]
            )
            created.extend(m.task_id for m in made)
        shard = engine.store.shards_of("acme")[0]
        later = NOW + 20_000
        promoted = await engine.dispatch.promote(shard, now_ms=later)
        assert promoted.more and 0 < promoted.moved < HERD
        assert (await engine.dispatch.tick(shard, now_ms=later)).dispatched == promoted.moved
        worker = Worker(engine.store, "acme", "default")
        sent = await worker.read(count=promoted.moved, block_ms=10)
        assert len(sent) == promoted.moved >= 3
        first, second, third = sent[:3]
        # Before any outcome, GET and the list say dispatched, at attempt 1.
        got = await engine.tasks.get("acme", first.run_id)
        assert (got.state, got.attempt) == ("dispatched", 1)
        assert await engine.outcomes.ack(first, "timewheel", now_ms=later)
        assert (await engine.tasks.get("acme", first.run_id)).state == "succeeded"
        await engine.outcomes.fail(second, "timewheel", "boom", now_ms=later)
        retried = await engine.tasks.get("acme", second.run_id)
        assert (retried.state, retried.attempt) == ("scheduled", 1)
        assert retried.due_ms > later
        assert (await engine.tasks.get("acme", third.run_id)).state == "dispatched"
        # A run still waiting in its far bucket is scheduled, not sent.
        waiting = sorted(set(created) - {d.run_id for d in sent})
        assert len(waiting) == HERD - promoted.moved
        for run_id in waiting[:20]:
            task = await engine.tasks.get("acme", run_id)
            assert (task.state, task.attempt) == ("scheduled", 0), run_id
    finally:
        await engine.close()
