"""Recurring schedules on real Redis, standalone and Cluster, on a fixed shard clock:
materializing, catch-up after downtime, overlap, and the control operations."""

from __future__ import annotations

import pytest

from timewheel.engine import Engine
from timewheel.errors import InvalidState, TaskNotFound
from timewheel.models import Delivery
from timewheel.schedules.model import NewSchedule, ScheduleChanges
from timewheel.testing.clock import NOW
from timewheel.testing.schedules import create, events, every, run_at

GROUP = "g"


@pytest.fixture
def engine(schedule_engine: Engine) -> Engine:
    return schedule_engine


async def test_every_second_materializes_the_horizon_and_fires_each_second(
    engine: Engine,
) -> None:
    sid = await create(engine, every(1), payload_json='{"job":"eval"}', queue="evals")
    sched = await engine.schedules.get("acme", sid)
    assert (sched.state, sched.runs_planned, sched.next_run_ms) == ("active", 5, NOW + 1000)
    seen: list[Delivery] = []
    for i in range(1, 11):
        got = await run_at(engine, NOW + i * 1000)
        assert [d.run_id for d in got] == [f"{sid}@{NOW + i * 1000}"]
        seen.extend(got)
    assert all(d.schedule_id == sid and d.task_id == sid for d in seen)
    assert all(d.payload == {"job": "eval"} and d.queue == "evals" for d in seen)
    assert [d.due_ms for d in seen] == [NOW + i * 1000 for i in range(1, 11)]
    sched = await engine.schedules.get("acme", sid)
    assert sched.last_run_ms == NOW + 10_000
    # Extended once the next unplanned fire time is within 3/4 of the horizon (3.75 s).
    assert 14 <= sched.runs_planned <= 15
    assert sched.next_run_ms == NOW + 11_000


async def test_planning_twice_is_a_no_op(engine: Engine) -> None:
    sid = await create(engine, every(1))
    shard = int(sid[:3], 16)
    # Extended once the next unplanned fire time (6 s) is within 3/4 horizon (3.75 s).
    assert (await engine.planner.plan(shard, now_ms=NOW + 2000)).added == 0
    first = await engine.planner.plan(shard, now_ms=NOW + 3000)
    again = await engine.planner.plan(shard, now_ms=NOW + 3000)
    assert first.added == 3 and again.added == 0  # 6 .. 8 s, then nothing new
    assert (await engine.schedules.get("acme", sid)).runs_planned == 8


async def test_max_runs_and_end_at_end_the_schedule(engine: Engine) -> None:
    capped = await create(engine, every(1), max_runs=3)
    ending = await create(engine, every(1, end_at_ms=NOW + 7000))
    sent = []
    for i in range(1, 12):
        sent += await run_at(engine, NOW + i * 1000)
    assert sum(d.schedule_id == capped for d in sent) == 3
    assert sum(d.schedule_id == ending for d in sent) == 7
    assert (await engine.schedules.get("acme", capped)).state == "ended"
    assert (await engine.schedules.get("acme", ending)).state == "ended"


async def downtime(engine: Engine, sid: str, restart: int) -> list[Delivery]:
    """Fire times up to NOW + 5 s were materialized; nothing ran until `restart`."""
    sent: list[Delivery] = []
    for _ in range(3):  # the planner catches up in passes, as a restarted node does
        sent += await run_at(engine, restart)
    return [d for d in sent if d.schedule_id == sid]


# Restart at NOW + 20 s with misfire_ms 2 s: fire times NOW + 1 .. NOW + 17 s are missed
# (17 of them, 5 materialized before the downtime and 12 planned after it); 18, 19 and
# 20 are merely late and run under every policy.
MISSED = [NOW + i * 1000 for i in range(1, 18)]
ON_TIME = [NOW + i * 1000 for i in (18, 19, 20)]


async def test_catchup_skip_dispatches_no_missed_run(engine: Engine) -> None:
    sid = await create(engine, every(1), catchup="skip")
    sent = await downtime(engine, sid, NOW + 20_000)
    assert [d.due_ms for d in sent] == ON_TIME
    skipped = await events(engine, sid, "skipped")
    assert sorted(int(e["due_ms"]) for e in skipped) == MISSED
    assert {e["reason"] for e in skipped} == {"misfire"}
    state = (await engine.tasks.get("acme", f"{sid}@{NOW + 1000}")).state
    assert state == "skipped"


async def test_catchup_latest_dispatches_exactly_the_newest_missed_run(engine: Engine) -> None:
    sid = await create(engine, every(1), catchup="latest")
    sent = await downtime(engine, sid, NOW + 20_000)
    assert [d.due_ms for d in sent] == [MISSED[-1], *ON_TIME]
    assert len(await events(engine, sid, "skipped")) == len(MISSED) - 1


async def test_catchup_all_dispatches_every_missed_run_in_order(engine: Engine) -> None:
    sid = await create(engine, every(1), catchup="all", catchup_window_ms=3_600_000)
    sent = await downtime(engine, sid, NOW + 20_000)
    assert [d.due_ms for d in sent] == MISSED + ON_TIME


async def test_catchup_all_is_bounded_by_the_window(engine: Engine) -> None:
    sid = await create(engine, every(1), catchup="all", catchup_window_ms=8_000)
    sent = await downtime(engine, sid, NOW + 20_000)
    assert [d.due_ms for d in sent] == [NOW + i * 1000 for i in range(12, 21)]


async def test_one_shot_tasks_are_never_dropped_for_lateness(engine: Engine) -> None:
    from timewheel.engine import NewTask

    res = await engine.tasks.create(NewTask(tenant="acme", run_at_ms=NOW + 1000), now_ms=NOW)
    sent = await run_at(engine, NOW + 3_600_000)
    assert [d.run_id for d in sent] == [res.task_id]


async def test_overlap_skip_skips_while_a_run_is_in_flight(engine: Engine) -> None:
    sid = await create(engine, every(1), overlap="skip")
    first = await run_at(engine, NOW + 1000)
    assert len(first) == 1
    assert await run_at(engine, NOW + 2000) == []  # the first is still being worked on
    assert await run_at(engine, NOW + 3000) == []
    assert await engine.outcomes.ack(first[0], GROUP, now_ms=NOW + 3500)
    later = await run_at(engine, NOW + 4000)
    assert [d.due_ms for d in later] == [NOW + 4000]
    skipped = await events(engine, sid, "skipped")
    assert [(int(e["due_ms"]), e["reason"]) for e in skipped] == [
        (NOW + 2000, "overlap"),
        (NOW + 3000, "overlap"),
    ]


async def test_overlap_buffer_one_holds_at_most_one_run(engine: Engine) -> None:
    sid = await create(engine, every(1), overlap="buffer_one")
    first = await run_at(engine, NOW + 1000)
    assert await run_at(engine, NOW + 2000) == []  # held
    assert await run_at(engine, NOW + 3000) == []  # skipped: one is held already
    assert [int(e["due_ms"]) for e in await events(engine, sid, "held")] == [NOW + 2000]
    assert [int(e["due_ms"]) for e in await events(engine, sid, "skipped")] == [NOW + 3000]
    await engine.outcomes.ack(first[0], GROUP, now_ms=NOW + 3200)
    released = await run_at(engine, NOW + 3300, plan=False)
    assert [d.run_id for d in released] == [f"{sid}@{NOW + 2000}"]
    await engine.outcomes.ack(released[0], GROUP, now_ms=NOW + 3400)
    assert [d.due_ms for d in await run_at(engine, NOW + 4000)] == [NOW + 4000]


async def test_a_failed_run_retries_and_still_counts_as_in_flight(engine: Engine) -> None:
    await create(engine, every(1), overlap="skip", options={"retry": {"initial_s": 0.1}})
    first = await run_at(engine, NOW + 1000)
    await engine.outcomes.fail(first[0], GROUP, "boom", delay_ms=100, now_ms=NOW + 1100)
    again = await run_at(engine, NOW + 1250)
    assert [(d.run_id, d.attempt) for d in again] == [(first[0].run_id, 2)]
    assert await run_at(engine, NOW + 2000) == []  # attempt 2 is in flight


async def test_pause_drops_pending_runs_and_resume_follows_catchup(engine: Engine) -> None:
    sid = await create(engine, every(1), catchup="latest")
    assert len(await run_at(engine, NOW + 1000)) == 1
    paused = await engine.schedules.pause("acme", sid, now_ms=NOW + 1500)
    assert paused.state == "paused" and paused.next_run_ms is None
    for i in range(2, 10):
        assert await run_at(engine, NOW + i * 1000) == []
    with pytest.raises(TaskNotFound):
        await engine.tasks.get("acme", f"{sid}@{NOW + 3000}")  # dropped, not cancelled
    resumed = await engine.schedules.resume("acme", sid, now_ms=NOW + 10_000)
    assert resumed.state == "active"
    sent = await run_at(engine, NOW + 10_000)
    # latest: of 2 .. 7 s (missed by more than 2 s) only 7 s runs; 8, 9, 10 s are late only.
    assert [d.due_ms for d in sent] == [NOW + i * 1000 for i in (7, 8, 9, 10)]


async def test_trigger_runs_once_now_with_a_manual_run_id(engine: Engine) -> None:
    sid = await create(engine, every(3600), overlap="skip")
    run_id = await engine.schedules.trigger("acme", sid, now_ms=NOW + 100)
    assert run_id == f"{sid}@manual-{NOW + 100}"
    sent = await run_at(engine, NOW + 200)
    assert [d.run_id for d in sent] == [run_id]
    again = await engine.schedules.trigger("acme", sid, now_ms=NOW + 300)
    assert [d.run_id for d in await run_at(engine, NOW + 400)] == [again]  # no overlap rule


async def test_backfill_materializes_a_past_range_in_order_once(engine: Engine) -> None:
    sid = await create(engine, every(60), catchup="skip")
    added, existing = await engine.schedules.backfill(
        "acme", sid, NOW - 300_000, NOW - 60_000, now_ms=NOW
    )
    assert (added, existing) == (5, 0)
    sent = await run_at(engine, NOW + 10)
    assert [d.due_ms for d in sent] == [NOW - 300_000 + i * 60_000 for i in range(5)]
    assert await engine.schedules.backfill(
        "acme", sid, NOW - 300_000, NOW - 60_000, now_ms=NOW
    ) == (
        0,
        5,
    )


async def test_update_replaces_future_runs_at_once(engine: Engine) -> None:
    sid = await create(engine, every(2), payload_json='{"v":1}')
    assert len(await run_at(engine, NOW + 2000)) == 1
    updated = await engine.schedules.update(
        "acme",
        sid,
        ScheduleChanges(spec=every(3), payload_json='{"v":2}'),
        now_ms=NOW + 2500,
    )
    assert updated.spec.every_s == 3
    with pytest.raises(TaskNotFound):
        await engine.tasks.get("acme", f"{sid}@{NOW + 4000}")  # the old plan is gone
    sent = []
    for i in range(3, 10):
        sent += await run_at(engine, NOW + i * 1000)
    assert [(d.due_ms, d.payload) for d in sent] == [
        (NOW + 3000, {"v": 2}),
        (NOW + 6000, {"v": 2}),
        (NOW + 9000, {"v": 2}),
    ]


async def test_delete_removes_the_schedule_and_its_pending_runs(engine: Engine) -> None:
    sid = await create(engine, every(1))
    assert await engine.schedules.delete("acme", sid, now_ms=NOW + 500) == 5
    with pytest.raises(TaskNotFound):
        await engine.schedules.get("acme", sid)
    assert await run_at(engine, NOW + 3000) == []


async def test_another_tenant_cannot_see_or_change_a_schedule(engine: Engine) -> None:
    sid = await create(engine, every(1))
    for op in (
        engine.schedules.get("other", sid),
        engine.schedules.pause("other", sid),
        engine.schedules.resume("other", sid),
        engine.schedules.trigger("other", sid),
        engine.schedules.delete("other", sid),
        engine.schedules.update("other", sid, ScheduleChanges(payload_json="1")),
    ):
        with pytest.raises(TaskNotFound):
            await op
    assert (await engine.schedules.get("acme", sid)).state == "active"


async def test_an_ended_schedule_cannot_be_paused(engine: Engine) -> None:
    sid = await create(engine, every(1), max_runs=1)
    assert (await engine.schedules.get("acme", sid)).state == "active"  # its run is to go
    assert len(await run_at(engine, NOW + 1000)) == 1
    assert (await engine.schedules.get("acme", sid)).state == "ended"
    with pytest.raises(InvalidState):
        await engine.schedules.pause("acme", sid)


async def test_idempotency_key_returns_the_same_schedule(engine: Engine) -> None:
    new = NewSchedule(tenant="acme", spec=every(5), idempotency_key="nightly")
    first, created = await engine.schedules.create(new, now_ms=NOW)
    again, created_again = await engine.schedules.create(new, now_ms=NOW)
    assert created and not created_again and first.id == again.id
    assert again.runs_planned == 1


async def test_an_update_computed_from_a_stale_read_is_refused_and_redone(engine: Engine) -> None:
    sid = await create(engine, every(2), payload_json='{"v":1}')
    stale = await engine.schedules.get("acme", sid)
    await engine.schedules.update("acme", sid, ScheduleChanges(spec=every(3)), now_ms=NOW)
    # Fire times computed from the every-2 spec read before: refused, nothing written.
    assert not await engine.schedules._update_once(stale, ScheduleChanges(payload_json='"x"'), NOW)
    now = await engine.schedules.get("acme", sid)
    assert (now.spec.every_s, now.payload_json) == (3, '{"v":1}')
    # Through update_schedule the read is redone: the payload lands on the every-3 plan.
    done = await engine.schedules.update("acme", sid, ScheduleChanges(payload_json='"x"'))
    assert (done.spec.every_s, done.payload_json, done.version) == (3, '"x"', now.version + 1)
