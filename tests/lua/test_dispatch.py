"""Real-time dispatch through the scheduler loop and the worker, standalone and Cluster."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest

from timewheel.dispatch.tick import Dispatch
from timewheel.engine import Engine
from timewheel.ids import shard_of
from timewheel.models import Delivery, TickResult
from timewheel.runs.worker import Worker
from timewheel.tasks.model import NewTask
from timewheel.testing.dispatch import all_deliveries, running_scheduler
from timewheel.testing.settings import test_settings


def now_ms() -> int:
    return int(time.time() * 1000)


async def test_a_task_due_in_1_5_s_arrives_within_1_s_with_its_envelope(engine: Engine) -> None:
    worker = Worker(engine.store, "acme", "default")
    await worker.ensure_groups()
    async with running_scheduler(engine):
        res = await engine.tasks.create(
            NewTask(tenant="acme", payload_json='{"job":"eval"}', delay_ms=1500)
        )
        deliveries: list[Delivery] = []
        deadline = time.monotonic() + 5
        while not deliveries and time.monotonic() < deadline:
            deliveries = await worker.read(block_ms=200)
        arrived_ms = now_ms()
    assert len(deliveries) == 1
    d = deliveries[0]
    assert d.run_id == res.task_id == d.task_id
    assert (d.tenant, d.queue, d.attempt, d.schedule_id) == ("acme", "default", 1, None)
    assert d.due_ms == res.due_ms
    assert 0 <= d.dispatched_ms - d.due_ms < 1000
    assert arrived_ms - d.due_ms < 1000  # read by the executor within a second of due
    assert d.payload == {"job": "eval"}
    assert await worker.ack(d)
    assert (await engine.tasks.get("acme", res.task_id)).state == "succeeded"


async def test_ten_thousand_runs_each_dispatched_exactly_once(engine: Engine) -> None:
    tenants = [f"tenant{i}" for i in range(20)]
    async with running_scheduler(engine) as scheduler:
        start = now_ms() + 6000  # creating 10,000 takes seconds on a loaded 2-core machine
        batch = [
            NewTask(tenant=tenants[i % 20], payload_json=str(i), run_at_ms=start + (i % 1000))
            for i in range(10_000)
        ]
        created = []
        for i in range(0, len(batch), 1000):
            created.extend(await engine.tasks.create_many(batch[i : i + 1000]))
        assert now_ms() < start, "creating took longer than the lead time"
        ids = {c.task_id for c in created}
        assert len(ids) == 10_000
        deadline = time.monotonic() + 20
        while scheduler.counters.dispatched < 10_000 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.3)  # let any duplicate show itself
    deliveries = await all_deliveries(engine)
    counts = Counter(d.run_id for d in deliveries)
    assert set(counts) == ids
    assert max(counts.values()) == 1
    late = [d for d in deliveries if d.dispatched_ms - d.due_ms >= 1000]
    assert not late, f"{len(late)} runs dispatched 1 s or more after due"


async def test_far_future_tasks_are_promoted_and_dispatched_on_time(redis_url: str) -> None:
    # Buckets of 500 ms and a 500 ms horizon: a task 3 s out starts in the far level.
    engine = await Engine.connect(test_settings(redis_url, bucket_ms=500, horizon_ms=500))
    try:
        async with running_scheduler(engine) as scheduler:
            await asyncio.sleep(0.2)
            res = [
                await engine.tasks.create(NewTask(tenant="acme", delay_ms=delay))
                for delay in (2500, 3000, 3300)
            ]
            shard = engine.store.shards_of("acme")[0]
            assert await engine.client.zcard(engine.keys.wheel(shard)) >= 1
            deadline = time.monotonic() + 8
            while scheduler.counters.dispatched < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        deliveries = {d.run_id: d for d in await all_deliveries(engine)}
        assert set(deliveries) == {r.task_id for r in res}
        assert scheduler.counters.promoted >= 3
        for d in deliveries.values():
            assert 0 <= d.dispatched_ms - d.due_ms < 1000
    finally:
        await engine.close()


async def test_worker_reads_every_shard_of_a_spread_tenant(redis_url: str) -> None:
    engine = await Engine.connect(test_settings(redis_url, default_spread=4))
    try:
        assert len(set(engine.store.shards_of("big"))) == 4
        worker = Worker(engine.store, "big", "default", consumer="w1")
        await worker.ensure_groups()
        created = await engine.tasks.create_many(
            [NewTask(tenant="big", delay_ms=0) for _ in range(200)]
        )
        homes = [
            engine.keys.shard_of_key((await engine.store.record_key(c.task_id))[0]) for c in created
        ]
        assert len(set(homes)) == 4
        async with running_scheduler(engine):
            got: list[Delivery] = []
            deadline = time.monotonic() + 10
            while len(got) < 200 and time.monotonic() < deadline:
                got.extend(await worker.read(count=100, block_ms=200))
        assert sorted(d.run_id for d in got) == sorted(c.task_id for c in created)
        acked = [await worker.ack(d) for d in got]
        assert all(acked)
        assert not await worker.ack(got[0])  # a second ack changes nothing
        states = {(await engine.tasks.get("big", c.task_id)).state for c in created}
        assert states == {"succeeded"}
        # Acknowledged entries are gone from the streams: nothing unacked is lost.
        assert sum([await engine.client.xlen(s) for s in worker.streams]) == 0
    finally:
        await engine.close()


async def test_a_backlog_drains_in_bounded_pipelines_each_run_once(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 8 shards of 600 runs each, due now; ticks of 200 runs, pipelines expecting <= 400.
    engine = await Engine.connect(
        test_settings(redis_url, default_spread=8, tick_batch=200, tick_pipeline_runs=400)
    )
    pipelines: list[int] = []  # runs each pipeline of tick calls dispatched
    limits: list[int | None] = []  # the most runs each of its ticks took
    tick_many = Dispatch.tick_many

    async def counted(
        self: Dispatch, shards: Any, *, node: str = "", limit: int | None = None
    ) -> Any:
        out = await tick_many(self, shards, node=node, limit=limit)
        pipelines.append(sum(r.dispatched for r in out if isinstance(r, TickResult)))
        limits.append(limit)
        return out

    monkeypatch.setattr(Dispatch, "tick_many", counted)
    try:
        created = []
        for _ in range(6):
            created += await engine.tasks.create_many([NewTask(tenant="big", delay_ms=0)] * 800)
        async with running_scheduler(engine) as scheduler:
            deadline = time.monotonic() + 20
            while scheduler.counters.dispatched < 4800 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)  # let any duplicate show itself
        counts = Counter(d.run_id for d in await all_deliveries(engine))
        assert set(counts) == {c.task_id for c in created} and max(counts.values()) == 1
        # The first pass knows nothing of the backlog: it shares its 400 runs between the
        # 8 shards it ticks (one pipeline of 8 x 50), as long as the passes after it.
        # Then every shard is backlogged: full ticks, each pipeline 2 shards of 200.
        assert limits[0] == 50 and pipelines[0] == 400
        assert max(pipelines[1:]) <= 400 and sum(pipelines) == 4800
        assert limits[1] == 200
    finally:
        await engine.close()


async def test_backlogged_shards_beside_quiet_ones_share_a_pass(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tenant spread over 4 of 8 shards with 2,400 runs due: the first pass shares its
    400 runs between the 8 shards it ticks (nothing tells yet where the herd is), after it
    each tick takes 100 runs (400 over the 4 backlogged shards), so every pass stays about
    400 runs long and a quiet shard's runs wait at most that behind the herd."""
    engine = await Engine.connect(
        test_settings(redis_url, default_spread=4, tick_batch=200, tick_pipeline_runs=400)
    )
    limits: list[int | None] = []
    pipelines: list[int] = []  # runs each pipeline of tick calls dispatched
    tick_many = Dispatch.tick_many

    async def counted(
        self: Dispatch, shards: Any, *, node: str = "", limit: int | None = None
    ) -> Any:
        limits.append(limit)
        out = await tick_many(self, shards, node=node, limit=limit)
        pipelines.append(sum(r.dispatched for r in out if isinstance(r, TickResult)))
        return out

    monkeypatch.setattr(Dispatch, "tick_many", counted)
    try:
        created = []
        for _ in range(3):
            created += await engine.tasks.create_many([NewTask(tenant="big", delay_ms=0)] * 800)
        assert len({shard_of(c.task_id) for c in created}) == 4
        async with running_scheduler(engine) as scheduler:
            deadline = time.monotonic() + 20
            while scheduler.counters.dispatched < 2400 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)  # let any duplicate show itself
        counts = Counter(d.run_id for d in await all_deliveries(engine))
        assert set(counts) == {c.task_id for c in created} and max(counts.values()) == 1
        assert limits[0] == 50 and limits[1] == 100
        assert max(pipelines) <= 400
    finally:
        await engine.close()
