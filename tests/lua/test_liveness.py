"""A scheduler node stays alive through work a tenant makes expensive: a planner stall
neither loses its leases nor holds back another tenant's runs."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from timewheel.dispatch.scheduler import Scheduler
from timewheel.engine import Engine
from timewheel.schedules import planner
from timewheel.schedules.model import NewSchedule
from timewheel.schedules.spec import ScheduleSpec
from timewheel.tasks.model import NewTask
from timewheel.testing.settings import test_settings

STALL_S = 3.0


async def test_a_planner_stall_keeps_leases_and_other_tenants_runs_on_time(
    standalone_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = test_settings(
        standalone_url, shards=4, plan_horizon_ms=2_000, plan_interval_ms=100, poll_cap_ms=50
    )
    engine = await Engine.connect(settings)
    stalled = threading.Event()
    real = planner.plan_fires  # type: ignore[attr-defined]

    def stalling(*args: Any) -> Any:
        if not stalled.is_set():  # the first planning of the run: seconds of pure CPU
            stalled.set()
            end = time.monotonic() + STALL_S
            while time.monotonic() < end:
                pass
        return real(*args)

    monkeypatch.setattr(planner, "plan_fires", stalling)
    scheduler = Scheduler(engine.store, node="n1", lease_ttl_ms=600)
    stop = asyncio.Event()
    running = asyncio.create_task(scheduler.run(stop))
    try:
        deadline = time.monotonic() + 10
        while len(scheduler.state) < settings.shards and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        epochs = {s: st.epoch for s, st in scheduler.state.items()}
        assert len(epochs) == settings.shards
        await engine.schedules.create(NewSchedule(tenant="noisy", spec=ScheduleSpec(every_s=1.0)))
        while not stalled.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert stalled.is_set(), "the planner never ran"
        # While the planner burns CPU: another tenant's runs, due over the stall.
        made = []
        for delay_ms in range(200, int(STALL_S * 1000), 200):
            made.append(await engine.tasks.create(NewTask(tenant="quiet", delay_ms=delay_ms)))
        await asyncio.sleep(STALL_S + 0.5)
        for result in made:
            task = await engine.tasks.get("quiet", result.task_id)
            assert task.state == "dispatched", task
        lags = []
        for shard in engine.store.shards_of("quiet"):
            stream = engine.keys.stream(shard, "quiet", "default")
            entries: Any = await engine.client.xrange(stream)
            for _, fields in entries:
                lags.append(int(fields[b"dispatched_ms"]) - int(fields[b"due_ms"]))
        assert len(lags) == len(made)
        assert max(lags) < 1000, lags
        # The node kept every lease, at the epoch it first took.
        assert {s: st.epoch for s, st in scheduler.state.items()} == epochs
    finally:
        stop.set()
        await running
        await engine.close()
