"""What a tenant holds, counted by the Lua operations themselves (lua/lib/usage.lua): every
operation that begins or ends what a limit counts changes the tenant's use hash in the
same call, and dispatch changes nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest

from timewheel import ids
from timewheel.archive.replay import RestoredRun
from timewheel.engine import Engine
from timewheel.errors import OverLimit
from timewheel.runs import dead_letters as deadletters
from timewheel.schedules.model import ScheduleChanges
from timewheel.tasks.model import NewTask
from timewheel.testing.clock import NOW
from timewheel.testing.dispatch import all_deliveries, prime, tick_all
from timewheel.testing.schedules import create, every, run_at

GROUP = "g"


async def held(engine: Engine, tenant: str) -> dict[str, int]:
    """The tenant's use hashes over its shards, added up, with its runs not finished
    (what holds its queues less its schedules); {} when it holds nothing."""
    total: dict[str, int] = {}
    for shard in engine.store.shards_of(tenant):
        raw: Any = await engine.client.hgetall(engine.keys.usage(shard, tenant))
        for k, v in raw.items():
            name = k.decode()
            total[name] = total.get(name, 0) + int(v)
    queued = sum(n for name, n in total.items() if name.startswith("q:"))
    total["runs"] = queued - total.get("schedules", 0)
    return {k: v for k, v in total.items() if v}


def task(queue: str, payload: str, **kw: Any) -> NewTask:
    return NewTask(tenant="acme", queue=queue, payload_json=payload, **kw)


async def test_create_cancel_and_update_count_runs_bytes_and_queues(engine: Engine) -> None:
    made = await engine.tasks.create_many(
        [
            task("a", '"xx"', run_at_ms=NOW + 60_000),
            task("a", '"yyyy"', run_at_ms=NOW + 60_000, idempotency_key="k"),
            task("b", "1", run_at_ms=NOW + 60_000),
        ]
    )
    again = await engine.tasks.create(
        task("a", '"other"', run_at_ms=NOW + 60_000, idempotency_key="k"), now_ms=NOW
    )
    assert not again.created  # a duplicate adds nothing
    assert await held(engine, "acme") == {"runs": 3, "bytes": 4 + 6 + 1, "q:a": 2, "q:b": 1}
    await engine.tasks.cancel("acme", made[2].task_id, now_ms=NOW)
    assert await held(engine, "acme") == {"runs": 2, "bytes": 10, "q:a": 2}
    await engine.tasks.update("acme", made[0].task_id, payload_json='"longer"', now_ms=NOW)
    assert await held(engine, "acme") == {"runs": 2, "bytes": 8 + 6, "q:a": 2}
    assert await held(engine, "other") == {}


async def test_dispatch_changes_nothing_and_ack_ends_a_run(engine: Engine) -> None:
    await engine.tasks.create_many([task("a", '"p"', run_at_ms=NOW + 100) for _ in range(3)])
    before = await held(engine, "acme")
    assert before == {"runs": 3, "bytes": 9, "q:a": 3}
    await prime(engine, NOW)
    assert await tick_all(engine, NOW + 1000) == 3
    assert await held(engine, "acme") == before  # in flight is not finished
    first, *_ = await all_deliveries(engine)
    assert await engine.outcomes.ack(first, GROUP, now_ms=NOW + 1100)
    assert await held(engine, "acme") == {"runs": 2, "bytes": 6, "q:a": 2}
    assert not await engine.outcomes.ack(first, GROUP, now_ms=NOW + 1200)  # stale: no change
    assert await held(engine, "acme") == {"runs": 2, "bytes": 6, "q:a": 2}


async def test_a_dead_letter_keeps_its_bytes_until_purged_and_replay_counts_again(
    engine: Engine,
) -> None:
    made = await engine.tasks.create(task("a", '"dead"', run_at_ms=NOW + 100), now_ms=NOW)
    await prime(engine, NOW)
    await tick_all(engine, NOW + 1000)
    [d] = await all_deliveries(engine)
    result = await engine.outcomes.fail(d, GROUP, "boom", permanent=True, now_ms=NOW + 1100)
    assert result.outcome == "dead"
    assert await held(engine, "acme") == {"bytes": 6}
    await deadletters.replay(engine.store, "acme", made.task_id)
    assert await held(engine, "acme") == {"runs": 1, "bytes": 6, "q:a": 1}
    await tick_all(engine, NOW + 2_000_000)  # the first delivery went with its failure
    [again] = await all_deliveries(engine)
    await engine.outcomes.fail(again, GROUP, "boom", permanent=True, now_ms=NOW + 2_000_100)
    await deadletters.purge(engine.store, "acme", made.task_id)
    assert await held(engine, "acme") == {}


async def test_a_replay_past_its_shards_cap_is_refused_and_stays_a_dead_letter(
    engine: Engine,
) -> None:
    made = await engine.tasks.create(task("a", '"dead"', run_at_ms=NOW + 100), now_ms=NOW)
    await prime(engine, NOW)
    await tick_all(engine, NOW + 1000)
    [d] = await all_deliveries(engine)
    await engine.outcomes.fail(d, GROUP, "boom", permanent=True, now_ms=NOW + 1100)
    await engine.tasks.create(task("a", '"x"', run_at_ms=NOW + 600_000), now_ms=NOW)
    before = await held(engine, "acme")
    assert before == {"runs": 1, "bytes": 9, "q:a": 1}
    with pytest.raises(OverLimit) as refused:
        await deadletters.replay(engine.store, "acme", made.task_id, caps=lambda t, s: 1)
    assert refused.value.field == "max_pending"
    assert await held(engine, "acme") == before
    [dead], _ = await deadletters.list_dead(engine.store, "acme")
    assert dead.run_id == made.task_id
    await deadletters.replay(engine.store, "acme", made.task_id, caps=lambda t, s: 2)
    assert await held(engine, "acme") == {"runs": 2, "bytes": 9, "q:a": 2}


async def test_a_run_expired_before_it_was_sent_stops_counting(engine: Engine) -> None:
    await engine.tasks.create(
        task("a", "1", run_at_ms=NOW + 100, options={"expires_at_ms": NOW + 500}), now_ms=NOW
    )
    await prime(engine, NOW)
    assert await tick_all(engine, NOW + 1000) == 0  # dead-lettered, not sent
    assert await held(engine, "acme") == {"bytes": 1}


async def test_schedules_count_themselves_not_their_planned_runs(engine: Engine) -> None:
    sid = await create(engine, every(1), queue="cron", payload_json='"tick"')
    assert await held(engine, "acme") == {"schedules": 1, "bytes": 6, "q:cron": 1}
    changes = ScheduleChanges(queue="other", payload_json="1")
    await engine.schedules.update("acme", sid, changes, now_ms=NOW)
    assert await held(engine, "acme") == {"schedules": 1, "bytes": 1, "q:other": 1}
    # Runs asked for by hand count like tasks; the planner's do not.
    await engine.schedules.trigger("acme", sid, now_ms=NOW)
    assert await held(engine, "acme") == {"schedules": 1, "runs": 1, "bytes": 2, "q:other": 2}
    sent = await run_at(engine, NOW + 1000)
    planned = next(d for d in sent if "manual" not in d.run_id)
    manual = next(d for d in sent if "manual" in d.run_id)
    # A planned run counts its payload only once it is a dead letter.
    await engine.outcomes.fail(planned, GROUP, "x", permanent=True, now_ms=NOW + 1100)
    assert await held(engine, "acme") == {"schedules": 1, "runs": 1, "bytes": 3, "q:other": 2}
    await engine.outcomes.ack(manual, GROUP, now_ms=NOW + 1100)
    await deadletters.purge(engine.store, "acme", planned.run_id)
    assert await held(engine, "acme") == {"schedules": 1, "bytes": 1, "q:other": 1}
    await engine.schedules.delete("acme", sid, now_ms=NOW + 1200)
    assert await held(engine, "acme") == {}


async def test_restore_counts_the_runs_and_schedules_it_writes(standalone_engine: Engine) -> None:
    engine = standalone_engine
    shard = engine.store.shards_of("acme")[0]
    run_id = ids.make_task_id(shard, ids.new_token())
    run = RestoredRun(
        state="scheduled",
        attempt=0,
        due_ms=NOW,
        tenant="acme",
        queue="q",
        created_ms=NOW,
        payload='"abc"',
    )
    keys = [engine.keys.meta(shard)]
    args = [engine.settings.bucket_ms, 1, *run.args(run_id)]
    assert await engine.store.scripts.restore_runs(engine.client, keys, args) == [1, 0]
    assert await engine.store.scripts.restore_runs(engine.client, keys, args) == [0, 1]
    sid = ids.make_task_id(shard, ids.new_token())
    flat = ["tenant", "acme", "queue", "s", "payload", "[1]", "state", "active"]
    skey = [engine.keys.schedule(shard, sid)]
    assert await engine.store.scripts.restore_schedule(engine.client, skey, [sid, json.dumps(flat)])
    want = {"runs": 1, "bytes": 5 + 3, "q:q": 1, "schedules": 1, "q:s": 1}
    assert await held(engine, "acme") == want
