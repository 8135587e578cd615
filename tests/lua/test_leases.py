"""Shard leases and fencing on a real Redis: the Lua contract, heartbeats, one node's
lease rounds and a hand-over between two schedulers."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from timewheel.dispatch.leases import Leases, share_of
from timewheel.dispatch.metrics import SchedulerMetrics
from timewheel.dispatch.ownership import Ownership
from timewheel.dispatch.scheduler import Scheduler
from timewheel.engine import Engine
from timewheel.errors import LeaseLost
from timewheel.tasks.model import NewTask
from timewheel.testing.clock import NOW
from timewheel.testing.dispatch import prime


async def test_lease_acquire_renew_release_and_epochs(engine: Engine) -> None:
    a, b = Leases(engine.store, "a", 2000), Leases(engine.store, "b", 2000)
    assert await a.acquire(5) == 1
    assert await a.acquire(5) == 1  # re-acquiring what one holds renews it, same epoch
    assert await b.acquire(5) is None
    assert not await b.renew(5, 1)
    assert not await b.release(5, 1)
    assert await a.renew(5, 1)
    assert await a.release(5, 1)
    assert await b.acquire(5) == 2  # every acquisition is a new epoch
    assert not await a.renew(5, 1)
    ttl = await engine.client.pttl(engine.keys.lease(5))
    assert 0 < ttl <= 2000


async def test_scripts_refuse_a_node_that_lost_its_lease(engine: Engine) -> None:
    await prime(engine)
    shard = engine.store.shards_of("acme")[0]
    a, b = Leases(engine.store, "a", 60_000), Leases(engine.store, "b", 60_000)
    old = await a.acquire(shard)
    assert old is not None
    await engine.tasks.create(NewTask(tenant="acme", run_at_ms=NOW), now_ms=NOW)
    # The lease passes to b (a paused past its ttl, say): a's epoch no longer holds.
    await engine.client.delete(engine.keys.lease(shard))
    new = await b.acquire(shard)
    assert new == old + 1
    with pytest.raises(LeaseLost):
        await engine.dispatch.tick(shard, now_ms=NOW, node="a", epoch=old)
    with pytest.raises(LeaseLost):
        await engine.dispatch.promote(shard, now_ms=NOW, node="a", epoch=old)
    with pytest.raises(LeaseLost):  # the same node name with a stale epoch is refused too
        await engine.dispatch.tick(shard, now_ms=NOW, node="b", epoch=old)
    res = await engine.dispatch.tick(shard, now_ms=NOW, node="b", epoch=new)
    assert res.dispatched == 1


async def test_heartbeat_lists_live_nodes_and_forgets_leavers(engine: Engine) -> None:
    a, b = Leases(engine.store, "a", 2000), Leases(engine.store, "b", 2000)
    assert await a.members() == ["a"]
    assert await b.members() == ["a", "b"]
    assert await b.members(leaving=True) == ["a"]
    stale = Leases(engine.store, "c", 2000)
    await stale.members()
    await engine.client.zadd(engine.keys.nodes(), {"c": 1})  # silent since 1970
    assert await a.members() == ["a"]


async def test_two_schedulers_split_the_shards_and_a_leaver_hands_over(engine: Engine) -> None:
    one = Scheduler(engine.store, node="one", lease_ttl_ms=2000)
    two = Scheduler(engine.store, node="two", lease_ttl_ms=2000)
    await one.ownership.round()
    assert set(one.state) == set(range(engine.settings.shards))  # alone: every shard
    await two.ownership.round()  # two joins: its share is still held by one
    await one.ownership.round()  # one sees two and releases two's share at once
    await two.ownership.round()
    assert set(one.state) | set(two.state) == set(range(engine.settings.shards))
    assert not set(one.state) & set(two.state)
    assert set(two.state) == share_of("two", ["one", "two"], engine.settings.shards)
    epochs = {s: int(st.epoch) for s, st in two.state.items()}
    assert all(e >= 2 for e in epochs.values())  # taken over: a new epoch each
    await two.ownership.leave()
    await one.ownership.round()
    assert set(one.state) == set(range(engine.settings.shards))
    assert one.metrics.lease_acquired._value.get() == engine.settings.shards + len(epochs)


async def test_leave_finishes_a_release_that_a_shutdown_cut_short(engine: Engine) -> None:
    """A shutdown cancels the lease round; a rebalance it was making has dropped the shard
    but not released its lease yet. Leaving releases it all the same: no lease is left
    naming the node, to keep its shard idle until it expires."""
    ownership = Ownership(engine.store, "a", 60_000, SchedulerMetrics())
    await ownership.round()  # the only live node: it takes every shard
    assert set(ownership.state) == set(range(engine.settings.shards))
    shard = min(ownership.state)
    ownership.busy.add(shard)  # a call of the tick pass in flight: the release waits for it
    giving_up = asyncio.create_task(ownership.release(shard, "rebalance"))
    await asyncio.sleep(0.01)
    giving_up.cancel()  # the shutdown cancels the lease round here
    with contextlib.suppress(asyncio.CancelledError):
        await giving_up
    ownership.busy.discard(shard)
    assert shard not in ownership.state
    assert await engine.client.get(engine.keys.lease(shard)) is not None  # still "a"'s
    await ownership.leave()
    held = [
        s for s in range(engine.settings.shards) if await engine.client.get(engine.keys.lease(s))
    ]
    assert held == []
