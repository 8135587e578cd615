"""A scheduler's timers against an estimate of Redis's clock gone wrong: none stays
further out than its own interval, and the first pass already runs on Redis's time."""

from __future__ import annotations

import asyncio

from timewheel.dispatch.scheduler import EXPIRE_EVERY_MS, Scheduler
from timewheel.engine import Engine
from timewheel.testing.dispatch import running_scheduler


async def test_timers_set_an_hour_out_come_back_within_their_intervals(
    standalone_engine: Engine,
) -> None:
    scheduler = Scheduler(standalone_engine.store)
    await scheduler.clock.sync(standalone_engine.client)
    now = scheduler.clock.now_ms()
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
