"""A scheduler's timers against an estimate of Redis's clock gone wrong: none stays
further out than its own interval, and the first pass already runs on Redis's time."""

from __future__ import annotations

import asyncio

from timewheel.dispatch.scheduler import CAP_EVERY_S, EXPIRE_EVERY_MS, Scheduler
from timewheel.engine import Engine
from timewheel.testing.dispatch import running_scheduler


async def synced(engine: Engine) -> tuple[Scheduler, float]:
    """A scheduler (not running) whose clock has read Redis's, and Redis's now in it."""
    scheduler = Scheduler(engine.store)
    await scheduler.clock.sync(engine.client)
    return scheduler, scheduler.clock.now_ms()


async def test_timers_set_an_hour_out_come_back_within_their_intervals(
    standalone_engine: Engine,
) -> None:
    scheduler, now = await synced(standalone_engine)
    for st in scheduler.state.values():  # as a stale estimate an hour ahead would set them
        st.next_tick_ms = st.next_promote_ms = st.next_plan_ms = now + 3_600_000
        st.next_reap_ms = st.next_expire_ms = now + 3_600_000
    await scheduler.run_once()
    s = standalone_engine.settings
    for st in scheduler.state.values():
        assert st.next_tick_ms <= now + s.sweep_ms + 1_000
        assert st.next_plan_ms <= now + s.plan_interval_ms * 1.25 + 1_000
        assert st.next_reap_ms <= now + s.reap_interval_ms + 1_000
        assert st.next_expire_ms <= now + EXPIRE_EVERY_MS + 1_000
        assert st.next_promote_ms <= now + s.horizon_ms + 1_000


async def test_the_first_pass_runs_on_redis_time(standalone_engine: Engine) -> None:
    store = standalone_engine.store
    assert not store.clock.known
    async with running_scheduler(standalone_engine) as scheduler:
        await asyncio.sleep(0.2)
        assert scheduler.clock.known
        sec, usec = await standalone_engine.client.time()
        assert abs(scheduler.clock.now_ms() - (int(sec) * 1000 + int(usec) / 1000)) < 50


async def test_timers_are_capped_at_a_bounded_rate_not_every_pass(
    standalone_engine: Engine,
) -> None:
    scheduler, now = await synced(standalone_engine)
    scheduler._cap_timers(now)  # the first look caps
    st = next(iter(scheduler.state.values()))
    st.next_reap_ms = now + 3_600_000
    scheduler._cap_timers(now)  # within CAP_EVERY_S: left as it is
    assert st.next_reap_ms == now + 3_600_000
    await asyncio.sleep(CAP_EVERY_S * 1.5)
    scheduler._cap_timers(now)
    assert st.next_reap_ms <= now + standalone_engine.settings.reap_interval_ms


async def test_plan_timers_do_not_wake_the_loop_while_a_planning_pass_is_out(
    standalone_engine: Engine,
) -> None:
    """A pass over many shards plans them one after the other; until it has visited a
    shard, that shard's plan timer is due. The loop sleeps meanwhile instead of passing
    over every shard again and again; the pass wakes it when it ends."""
    scheduler, now = await synced(standalone_engine)
    for st in scheduler.state.values():
        st.next_tick_ms = st.next_promote_ms = now + 500
        st.next_reap_ms = st.next_expire_ms = now + 500
        st.next_plan_ms = now - 1
    assert scheduler._sleep_s() == 0.0  # due plan timers and no pass out: plan now
    planning: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    scheduler._plan_task = planning  # type: ignore[assignment]
    try:
        # until the next tick timer (or the poll cap, if that comes first)
        expected = min(0.5, standalone_engine.settings.poll_cap_ms / 1000)
        assert expected - 0.05 < scheduler._sleep_s() <= expected
    finally:
        planning.cancel()
        scheduler._plan_task = None
