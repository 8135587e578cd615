"""A clean deployment under load reports no finding at all: audits while the scheduler
dispatches a herd, a worker acknowledges part of it and fails some for good, schedules
fire every second and a rate-limited tenant waits on its tokens; and once more after. Both
audits check the event logs and every usage field too."""

from __future__ import annotations

import asyncio
import time

from timewheel.audit.findings import Kind
from timewheel.dispatch.rates import DispatchRates
from timewheel.engine import Engine
from timewheel.errors import PermanentError
from timewheel.models import Delivery
from timewheel.runs.worker import Worker
from timewheel.schedules.model import NewSchedule
from timewheel.schedules.spec import ScheduleSpec
from timewheel.tasks.model import NewTask
from timewheel.tenants import Limits, TenantStore
from timewheel.testing.audit import audit
from timewheel.testing.dispatch import running_scheduler

HERD = 20_000
HERD_TENANTS = [f"herd-{i}" for i in range(4)]


async def _dead_letters(engine: Engine) -> int:
    total = 0
    for tenant in HERD_TENANTS:
        for shard in engine.store.shards_of(tenant):
            total += await engine.client.xlen(engine.keys.dead(shard, tenant))
    return total


async def test_a_busy_clean_deployment_has_no_finding(standalone_engine: Engine) -> None:
    engine = standalone_engine
    tenants = TenantStore(engine.client, engine.keys, rates=DispatchRates.of(engine.store))
    worker = Worker(engine.store, HERD_TENANTS[0], "default", concurrency=50)

    async def handle(d: Delivery) -> None:
        if d.payload == "die":
            raise PermanentError("no")

    # An executor that took deliveries of herd-1 and is still at work on them.
    busy = Worker(engine.store, HERD_TENANTS[1], "default", consumer="busy")
    async with running_scheduler(engine):  # a running deployment, then the load
        # 80 s of runs held back by their rate: they outlast both audits below
        await tenants.create_tenant("slow", Limits(dispatch_rate=10))
        for _ in range(20):
            await engine.schedules.create(NewSchedule(tenant="cron", spec=ScheduleSpec(every_s=1)))
        await engine.tasks.create_many([NewTask(tenant="slow", delay_ms=0) for _ in range(800)])
        for start in range(0, HERD, 2_000):
            await engine.tasks.create_many(
                [
                    NewTask(
                        tenant=HERD_TENANTS[i % 4],
                        delay_ms=0,
                        payload_json='"die"' if i % 97 == 0 else '"ok"',
                    )
                    for i in range(start, start + 2_000)
                ]
            )
        stop = asyncio.Event()
        working = asyncio.create_task(worker.run(handle, stop))
        deadline = time.monotonic() + 30
        while worker.handled + worker.failed < 1_500:
            assert time.monotonic() < deadline, "the worker made no progress"
            await asyncio.sleep(0.05)
        assert await busy.read(count=200, block_ms=100)
        # With the event logs and usage counts too (what the continuous auditor checks).
        during = await audit(engine, None, events=True)  # the worker and the scheduler at work
        assert during.clean, during.findings[:20]
        while worker.handled + worker.failed < 3_000:
            assert time.monotonic() < deadline, "the worker made no progress"
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(working, 10)
        after = await audit(engine, None, events=True)  # the scheduler still at work
        assert after.clean, after.findings[:20]
        slow_shard = engine.store.shards_of("slow")[0]
        held = await engine.client.zcard(engine.keys.near(slow_shard, "slow"))
    assert held > 0, "the rate-limited tenant had runs held back during the audit"
    assert await _dead_letters(engine) > 0
    assert 0 < worker.handled < HERD // 4
    assert after.examined.records >= HERD + 800
    assert after.examined.entries > HERD // 2
    assert not after.counts.get(Kind.OVERDUE)
    assert not after.counts.get(Kind.USAGE_MISMATCH)
    assert after.examined.events > 0
