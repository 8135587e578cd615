"""Tenants' dispatch rates: the tick's token buckets, and the per-shard copies, on
standalone and Cluster."""

from __future__ import annotations

import asyncio
import time

from timewheel.dispatch.rates import DispatchRates, share_text
from timewheel.engine import Engine
from timewheel.tasks.model import NewTask
from timewheel.tenants import Limits, TenantStore
from timewheel.testing.clock import NOW
from timewheel.testing.dispatch import all_deliveries, prime, running_scheduler


def _neighbour(engine: Engine, shard: int) -> str:
    """A tenant whose runs land in `shard`."""
    return next(
        f"tenant-f{i}" for i in range(10_000) if engine.store.shards_of(f"tenant-f{i}")[0] == shard
    )


async def test_a_rate_sends_a_second_of_runs_then_one_per_token(engine: Engine) -> None:
    """10 runs/s: a full bucket (one second) goes at once, then a run per 100 ms; the
    tenant waits in the due index meanwhile, and a neighbour in the shard is not held."""
    await prime(engine)
    slow = "tenant-slow"
    shard = engine.store.shards_of(slow)[0]
    fast = _neighbour(engine, shard)
    await DispatchRates.of(engine.store).put(slow, 10.0 * len(engine.store.shards_of(slow)))
    due = NOW + 1000
    await engine.tasks.create_many([NewTask(tenant=slow, run_at_ms=due) for _ in range(50)])
    await engine.tasks.create_many([NewTask(tenant=fast, run_at_ms=due) for _ in range(50)])

    res = await engine.dispatch.tick(shard, now_ms=due)
    assert res.per_tenant == {slow: 10, fast: 50}
    assert res.held == {slow: 40}
    assert res.next_due_ms == due + 100  # the next token, not "now": the scheduler sleeps

    res = await engine.dispatch.tick(shard, now_ms=due + 99)
    assert (res.dispatched, res.held) == (0, {})  # not even looked at before its token
    res = await engine.dispatch.tick(shard, now_ms=due + 100)
    assert (res.per_tenant, res.held) == ({slow: 1}, {slow: 39})
    res = await engine.dispatch.tick(shard, now_ms=due + 1100)  # a second refills the bucket
    assert (res.per_tenant, res.held) == ({slow: 10}, {slow: 29})

    sent, now = 21, due + 1100
    while sent < 50:
        assert res.next_due_ms is not None
        now = res.next_due_ms
        res = await engine.dispatch.tick(shard, now_ms=now)
        assert res.dispatched == 1
        sent += 1
    assert now == due + 4000  # 50 runs at 10/s with a bucket of 10: 4 s
    assert res.held == {} and res.next_due_ms is None

    sent_ms = sorted(d.dispatched_ms for d in await all_deliveries(engine) if d.tenant == slow)
    assert len(sent_ms) == 50
    for i in range(len(sent_ms)):  # no window of 1 s holds more than rate + bucket
        assert sum(1 for t in sent_ms[i:] if t < sent_ms[i] + 1000) <= 20


async def test_clearing_a_rate_releases_the_held_runs(engine: Engine) -> None:
    await prime(engine)
    tenant = "tenant-held"
    shard = engine.store.shards_of(tenant)[0]
    rates = DispatchRates.of(engine.store)
    await rates.put(tenant, 1.0 * len(engine.store.shards_of(tenant)))
    due = NOW + 1000
    await engine.tasks.create_many([NewTask(tenant=tenant, run_at_ms=due) for _ in range(30)])
    res = await engine.dispatch.tick(shard, now_ms=due)
    assert (res.dispatched, res.held) == (1, {tenant: 29})
    await rates.put(tenant, None)
    # Its due-index entry says "in 1 s"; a create due now (or that second passing) brings
    # it back, and without a rate the rest goes in one tick.
    res = await engine.dispatch.tick(shard, now_ms=due + 1000)
    assert (res.dispatched, res.held) == (29, {})


async def test_rates_are_copied_to_the_tenants_shards_and_resynced(engine: Engine) -> None:
    rates = DispatchRates.of(engine.store)
    store = TenantStore(engine.client, engine.keys, rates=rates)
    await store.create_tenant("limited", Limits(dispatch_rate=30))
    await store.create_tenant("free", Limits(max_pending=5))
    shards = engine.store.shards_of("limited")
    k = engine.keys

    async def copies(tenant: str) -> dict[int, bytes | str]:
        out = {}
        for shard in range(engine.settings.shards):
            value = await engine.client.hget(k.rates(shard), tenant)
            if value is not None:
                out[shard] = value
        return out

    want = {shard: share_text(30, len(shards)).encode() for shard in shards}
    assert await copies("limited") == want
    assert await copies("free") == {}
    other = next(s for s in range(engine.settings.shards) if s not in shards)
    await engine.client.hdel(k.rates(shards[0]), "limited")  # lost between the two writes
    await engine.client.hset(k.rates(other), "ghost", "5")  # a tenant that has no rate now
    await engine.client.hset(k.tenants(), "broken", "{not json")  # skipped, not fatal
    assert await rates.sync() == 2
    assert await copies("limited") == want
    assert await copies("ghost") == {}
    assert await rates.sync() == 0


async def test_a_running_scheduler_keeps_a_tenant_to_its_rate(engine: Engine) -> None:
    """Real time: 60 runs due at once for a tenant of 20 runs/s take about 2 s, no window
    of 1 s holds more than rate + bucket, and a neighbour's runs are not slowed."""
    slow = "tenant-live"
    shard = engine.store.shards_of(slow)[0]
    fast = _neighbour(engine, shard)
    store = TenantStore(engine.client, engine.keys, rates=DispatchRates.of(engine.store))
    await store.create_tenant(slow, Limits(dispatch_rate=20.0))
    async with running_scheduler(engine) as scheduler:  # its rate sync keeps the copies
        await asyncio.sleep(0.2)
        due = int(time.time() * 1000) + 500
        await engine.tasks.create_many([NewTask(tenant=slow, run_at_ms=due) for _ in range(60)])
        await engine.tasks.create_many([NewTask(tenant=fast, run_at_ms=due) for _ in range(60)])
        deadline = time.monotonic() + 15
        while scheduler.counters.dispatched < 120 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    deliveries = await all_deliveries(engine)
    slow_ms = sorted(d.dispatched_ms for d in deliveries if d.tenant == slow)
    fast_ms = sorted(d.dispatched_ms for d in deliveries if d.tenant == fast)
    assert (len(slow_ms), len(fast_ms)) == (60, 60)
    spread = len(engine.store.shards_of(slow))
    if spread == 1:
        assert slow_ms[-1] - slow_ms[0] >= 1900  # 40 runs past the bucket at 20/s
    for i in range(len(slow_ms)):
        assert sum(1 for t in slow_ms[i:] if t < slow_ms[i] + 1000) <= 40
    assert fast_ms[-1] - due < 1000  # the neighbour went out on time


async def test_changing_a_rate_moves_the_copies_and_keeps_other_limits(engine: Engine) -> None:
    rates = DispatchRates.of(engine.store)
    store = TenantStore(engine.client, engine.keys, rates=rates)
    await store.create_tenant("changing", Limits(max_pending=7, dispatch_rate=10))
    shards = engine.store.shards_of("changing")
    tenant = await store.update_limits("changing", {"dispatch_rate": 40.0})
    assert tenant.limits == Limits(max_pending=7, dispatch_rate=40.0)
    assert await store.get_tenant("changing") == tenant
    for shard in shards:
        value = await engine.client.hget(engine.keys.rates(shard), "changing")
        assert value == share_text(40, len(shards)).encode()
    tenant = await store.update_limits("changing", {"dispatch_rate": None, "max_pending": None})
    assert tenant.limits == Limits()
    for shard in shards:
        assert await engine.client.hget(engine.keys.rates(shard), "changing") is None
    assert await rates.sync() == 0  # the tenants hash and the copies agree


async def test_concurrent_limit_changes_are_not_lost(engine: Engine) -> None:
    store = TenantStore(engine.client, engine.keys)
    await store.create_tenant("racing", Limits())
    await asyncio.gather(
        *(store.update_limits("racing", {"max_pending": 100 + i}) for i in range(10)),
        *(store.update_limits("racing", {"dispatch_rate": 1.0 + i}) for i in range(10)),
    )
    limits = (await store.get_tenant("racing")).limits
    assert limits.max_pending is not None and limits.dispatch_rate is not None
