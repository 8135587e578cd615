"""A schedule's jitter_s: every run due a fixed offset after its fire time, picked per
schedule, so schedules sharing a cron expression do not fire in one instant. Standalone
and Cluster, on a fixed shard clock."""

from __future__ import annotations

from collections import Counter

import pytest

from timewheel.engine import Engine
from timewheel.errors import ValidationError
from timewheel.schedules.model import NewSchedule, ScheduleChanges
from timewheel.schedules.spec import ScheduleSpec
from timewheel.tasks.window import offset_ms
from timewheel.testing.clock import NOW
from timewheel.testing.schedules import create, events, every, run_at


@pytest.fixture
def engine(schedule_engine: Engine) -> Engine:
    return schedule_engine


async def test_runs_are_due_their_schedules_offset_after_each_fire_time(engine: Engine) -> None:
    sid = await create(engine, every(10), options={"jitter_s": 4})
    offset = offset_ms(sid, 4000)
    sched = await engine.schedules.get("acme", sid)
    assert sched.options == {"jitter_s": 4, "jitter_offset_ms": offset}
    assert sched.next_run_ms == NOW + 10_000 + offset  # the time the run is due
    if offset > 0:
        assert await run_at(engine, NOW + 10_000 + offset - 1) == []
    got = await run_at(engine, NOW + 10_000 + offset)
    assert [(d.run_id, d.due_ms) for d in got] == [(f"{sid}@{NOW + 10_000}", NOW + 10_000 + offset)]
    run = await engine.tasks.get("acme", f"{sid}@{NOW + 10_000}")
    assert run.due_ms == NOW + 10_000 + offset
    assert "jitter_s" not in run.options and "jitter_offset_ms" not in run.options
    got = await run_at(engine, NOW + 20_000 + offset)  # still evenly spaced, 10 s apart
    assert [(d.run_id, d.due_ms) for d in got] == [(f"{sid}@{NOW + 20_000}", NOW + 20_000 + offset)]


async def test_a_cron_herd_is_spread_over_the_jitter(engine: Engine) -> None:
    """200 schedules on one cron expression with jitter_s 60: their next runs fall all over
    the minute after the fire time; without jitter they would share one instant."""
    spec = ScheduleSpec(cron="*/5 * * * *", timezone="UTC")
    dues = []
    for _ in range(200):
        sched, _ = await engine.schedules.create(
            NewSchedule(tenant="herd", spec=spec, options={"jitter_s": 60}), now_ms=NOW
        )
        assert sched.next_run_ms is not None
        dues.append(sched.next_run_ms)
    base = min(dues) - min(dues) % 300_000  # the fire time: a whole 5 minutes
    assert all(base <= d <= base + 60_000 for d in dues), (base, min(dues), max(dues))
    quarters = Counter((d - base) * 4 // 60_001 for d in dues)  # 50 each expected
    assert sorted(quarters) == [0, 1, 2, 3] and all(25 <= n <= 75 for n in quarters.values())


async def test_latest_catch_up_counts_lateness_from_the_jittered_time(engine: Engine) -> None:
    """Down from fire time 2 s to 12 s (misfire_ms 2 s): 'latest' sends the newest missed
    run (9 s) and the ones still on time (10-12 s), and skips the rest."""
    sid = await create(engine, every(1), catchup="latest", options={"jitter_s": 0.5})
    offset = offset_ms(sid, 500)
    got = await run_at(engine, NOW + 1000 + offset)
    assert [d.run_id for d in got] == [f"{sid}@{NOW + 1000}"]
    got = await run_at(engine, NOW + 12_000 + offset)
    assert sorted(d.run_id for d in got) == [f"{sid}@{NOW + k * 1000}" for k in (9, 10, 11, 12)]
    assert all(d.due_ms == int(d.run_id.split("@")[1]) + offset for d in got)
    skipped = {e["id"] for e in await events(engine, sid, "skipped")}
    assert skipped == {f"{sid}@{NOW + k * 1000}" for k in range(2, 9)}


async def test_changing_jitter_moves_the_pending_runs(engine: Engine) -> None:
    sid = await create(engine, every(10))
    before = await engine.schedules.get("acme", sid)
    assert before.next_run_ms == NOW + 10_000 and "jitter_offset_ms" not in before.options
    after = await engine.schedules.update(
        "acme", sid, ScheduleChanges(options={"jitter_s": 5}), now_ms=NOW
    )
    assert after.next_run_ms == NOW + 10_000 + offset_ms(sid, 5000)
    off = await engine.schedules.update(
        "acme", sid, ScheduleChanges(options={"jitter_s": 0}), now_ms=NOW
    )
    assert off.next_run_ms == NOW + 10_000 and "jitter_offset_ms" not in off.options


@pytest.mark.parametrize("jitter", [-1, "5", 86_401])
async def test_a_bad_jitter_is_refused(engine: Engine, jitter: object) -> None:
    with pytest.raises(ValidationError) as bad:
        await engine.schedules.create(
            NewSchedule(tenant="acme", spec=every(10), options={"jitter_s": jitter}), now_ms=NOW
        )
    assert bad.value.field == "jitter_s"
