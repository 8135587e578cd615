"""Schedules with real schedulers and executors on a real redis-server, in real time:
catch-up after every scheduler was stopped, overlap with a slow executor."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from itertools import pairwise
from typing import Any

import pytest

from timewheel.dispatch.scheduler import Scheduler
from timewheel.engine import Engine
from timewheel.models import Delivery
from timewheel.runs.worker import Worker
from timewheel.schedules.model import NewSchedule
from timewheel.schedules.spec import ScheduleSpec, fire_times
from timewheel.testing.dispatch import all_deliveries, running_scheduler
from timewheel.testing.settings import test_settings

MISFIRE_MS = 1_000


@pytest.fixture
async def engine(standalone_url: str) -> AsyncIterator[Engine]:
    eng = await Engine.connect(
        test_settings(standalone_url, misfire_ms=MISFIRE_MS, plan_horizon_ms=2_000)
    )
    try:
        yield eng
    finally:
        await eng.close()


async def skipped(engine: Engine, sid: str, reason: str) -> list[int]:
    entries: Any = await engine.client.xrange(engine.keys.events(int(sid[:3], 16)))
    return sorted(
        int(f[b"due_ms"])
        for _, f in entries
        if f[b"e"] == b"skipped"
        and f[b"id"].startswith(sid.encode())
        and f[b"reason"] == reason.encode()
    )


@pytest.mark.parametrize("catchup", ["skip", "latest", "all"])
async def test_missed_fire_times_follow_catchup_after_all_schedulers_stop(
    engine: Engine, catchup: str
) -> None:
    sched, _ = await engine.schedules.create(
        NewSchedule(tenant="acme", spec=ScheduleSpec(every_s=1), catchup=catchup)
    )
    async with running_scheduler(engine):
        await asyncio.sleep(2.5)
    stopped_ms = time.time() * 1000
    await asyncio.sleep(5.0)  # no scheduler runs: about five fire times go by
    restart_ms = time.time() * 1000
    async with running_scheduler(engine):
        await asyncio.sleep(2.5)
    sent = [d.due_ms for d in await all_deliveries(engine) if d.schedule_id == sched.id]
    # Missed: due while no scheduler ran and more than misfire_ms before the restart.
    missed = fire_times(sched.spec, int(stopped_ms), int(restart_ms) - MISFIRE_MS - 50)
    assert len(missed) >= 3
    gone = await skipped(engine, sched.id, "misfire")
    ran = [f for f in sent if f in missed]
    if catchup == "skip":
        assert ran == [] and set(missed) <= set(gone)
    elif catchup == "latest":
        assert len(ran) == 1 and ran[0] >= missed[-1] and set(missed) - set(ran) <= set(gone)
    else:
        assert ran == missed and gone == []
    assert sent == sorted(sent) and len(sent) == len(set(sent))


@pytest.mark.parametrize("overlap", ["skip", "buffer_one"])
async def test_overlap_with_a_slow_executor(engine: Engine, overlap: str) -> None:
    sched, _ = await engine.schedules.create(
        NewSchedule(tenant="acme", spec=ScheduleSpec(every_s=1), overlap=overlap)
    )
    spans: list[tuple[float, float]] = []

    async def slow(delivery: Delivery) -> None:
        started = time.monotonic()
        await asyncio.sleep(2.2)
        spans.append((started, time.monotonic()))

    worker = Worker(engine.store, "acme", "default", concurrency=4)
    stop = asyncio.Event()
    async with running_scheduler(engine):
        working = asyncio.create_task(worker.run(slow, stop))
        await asyncio.sleep(8.0)
        stop.set()
        await asyncio.wait_for(working, 10)
        await asyncio.sleep(0.5)  # a run the last ack released goes out
    assert len(spans) >= 2
    spans.sort()
    for (_, end), (start, _) in pairwise(spans):
        assert start >= end - 0.05, "two runs of the schedule were in flight at once"
    overlapped = await skipped(engine, sched.id, "overlap")
    entries: Any = await engine.client.xrange(engine.keys.events(int(sched.id[:3], 16)))
    held = [f[b"id"].decode() for _, f in entries if f[b"e"] == b"held"]
    if overlap == "skip":
        assert len(overlapped) >= 3 and held == []
    else:
        assert held and len(overlapped) >= 1
        # A held run goes out right after the run before it finishes: back to back.
        assert min(b[0] - a[1] for a, b in pairwise(spans)) < 0.5
        # Never more than one held: every held run but the newest has been sent.
        states = [(await engine.tasks.get("acme", run_id)).state for run_id in held]
        assert set(states[:-1]) <= {"succeeded", "dispatched"}, states


async def test_a_planner_behind_catches_up_and_no_shard_waits_behind_others(
    standalone_url: str,
) -> None:
    # plan_batch 2: a pass that keeps up extends 2 schedules. Horizon 4 s: a new schedule
    # holds runs up to ~5 s ahead, is due for planning 3 s before they run out (in ~2 s),
    # and counts as behind 2 s before (in ~3 s).
    engine = await Engine.connect(
        test_settings(standalone_url, shards=8, plan_batch=2, plan_horizon_ms=4_000)
    )
    try:
        made = [
            await engine.schedules.create(NewSchedule(tenant=f"t{i}", spec=ScheduleSpec(every_s=1)))
            for i in range(16)
        ]
        cursors = {s.id: await cursor(engine, s.id) for s, _ in made}
        shards = sorted({int(s.id[:3], 16) for s, _ in made})
        scheduler = Scheduler(engine.store)
        now = time.time() * 1000

        # Keeping up: one batch per pass, and the next pass starts where this one stopped.
        await scheduler.planning.plan_some(shards, now + 2_400)
        first = {sid for sid, c in cursors.items() if await cursor(engine, sid) != c}
        assert len(first) == 2
        await scheduler.planning.plan_some(shards, now + 2_400)
        second = {sid for sid, c in cursors.items() if await cursor(engine, sid) != c} - first
        assert len(second) == 2
        assert {int(sid[:3], 16) for sid in second}.isdisjoint({int(sid[:3], 16) for sid in first})

        # Behind (under half a horizon of runs left): batch after batch, every schedule.
        await scheduler.planning.plan_some(shards, now + 3_500)
        assert all([await cursor(engine, sid) != c for sid, c in cursors.items()])
    finally:
        await engine.close()


async def cursor(engine: Engine, sid: str) -> bytes | str | None:
    value: bytes | str | None = await engine.client.hget(
        engine.keys.schedule(int(sid[:3], 16), sid), "cursor"
    )
    return value
