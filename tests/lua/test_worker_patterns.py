"""A worker given tenant patterns on a real Redis: it serves the registered tenants they
match, leaves the others alone, picks up a tenant registered while it runs (with the runs
dispatched before it looked), and waits when nothing matches yet."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable

from timewheel.engine import Engine
from timewheel.models import Delivery
from timewheel.runs.worker import Worker
from timewheel.tasks.model import NewTask
from timewheel.tenants import Limits, TenantStore
from timewheel.testing.clock import NOW
from timewheel.testing.dispatch import prime, tick_all


async def _until(done: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def _dispatched(engine: Engine, tenant: str, queue: str, count: int) -> None:
    await engine.tasks.create_many(
        [NewTask(tenant=tenant, queue=queue, run_at_ms=NOW) for _ in range(count)]
    )
    while await tick_all(engine, NOW + 1, limit=5000):
        pass


async def _register(engine: Engine, *tenants: str) -> None:
    store = TenantStore(engine.client, engine.keys)
    for tenant in tenants:
        await store.create_tenant(tenant, Limits())


async def test_a_pattern_serves_the_registered_tenants_it_matches(engine: Engine) -> None:
    await prime(engine)
    await _register(engine, "acme-eu", "acme-us", "globex")
    for tenant in ("acme-eu", "acme-us", "globex", "acme-unregistered"):
        await _dispatched(engine, tenant, "hooks", 5)
    await _dispatched(engine, "acme-eu", "default", 3)  # another queue: not served
    seen: Counter[tuple[str, str]] = Counter()

    async def handler(d: Delivery) -> None:
        seen[(d.tenant, d.queue)] += 1

    worker = Worker(engine.store, pairs=[("acme-*", "hooks")], concurrency=4)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(handler, stop))
    try:
        await _until(lambda: worker.handled == 10, 20, "the matched pairs were not drained")
        await asyncio.sleep(0.3)  # nothing else arrives
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)
    assert seen == {("acme-eu", "hooks"): 5, ("acme-us", "hooks"): 5}
    assert worker.pairs == [("acme-eu", "hooks"), ("acme-us", "hooks")]
    assert worker.patterns == [("acme-*", "hooks")]
    globex = engine.keys.stream(engine.store.shards_of("globex")[0], "globex", "hooks")
    assert await engine.client.xlen(globex) == 5  # left for its own executors


async def test_a_tenant_registered_later_is_served_with_what_waited(engine: Engine) -> None:
    """A worker whose pattern matches nothing waits; a tenant registered while it runs is
    served at the next look at the registry, runs dispatched before it included."""
    await prime(engine)
    await _register(engine, "globex")
    seen: list[str] = []

    async def handler(d: Delivery) -> None:
        seen.append(d.tenant)

    worker = Worker(engine.store, "new-*", "default", tenants_refresh_s=0.2)
    assert (worker.tenant, worker.pairs) == ("new-*", [])
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(handler, stop))
    try:
        await asyncio.sleep(0.5)
        assert not task.done() and worker.pairs == []
        await _dispatched(engine, "new-one", "default", 4)  # before the tenant is registered
        await asyncio.sleep(0.5)
        assert seen == []  # not registered yet: not matched
        await _register(engine, "new-one")
        await _until(lambda: worker.handled == 4, 10, "the new tenant was not served")
        await _dispatched(engine, "new-one", "default", 2)  # and what comes after
        await _until(lambda: worker.handled == 6, 10, "later runs were not served")
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)
    assert seen == ["new-one"] * 6
    assert worker.pairs == [("new-one", "default")]


async def test_names_and_patterns_together_and_a_star(engine: Engine) -> None:
    """A named tenant need not be registered; `*` adds every registered one, once."""
    await prime(engine)
    await _register(engine, "acme", "globex")
    for tenant in ("acme", "globex", "loose"):
        await _dispatched(engine, tenant, "default", 3)
    seen: Counter[str] = Counter()

    async def handler(d: Delivery) -> None:
        seen[d.tenant] += 1

    worker = Worker(engine.store, pairs=[("loose", "default"), ("*", "default")])
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(handler, stop))
    try:
        await _until(lambda: worker.handled == 9, 20, "not every pair was served")
    finally:
        stop.set()
        await asyncio.wait_for(task, 20)
    assert seen == {"acme": 3, "globex": 3, "loose": 3}
    assert worker.pairs == [("loose", "default"), ("acme", "default"), ("globex", "default")]


async def test_the_step_api_reads_nothing_until_a_tenant_matches(fast: Engine) -> None:
    await prime(fast)
    await _dispatched(fast, "none-1", "default", 1)
    worker = Worker(fast.store, "none-*", "default", tenants_refresh_s=0.05)
    assert await worker.read(block_ms=50) == []  # none-1 is not registered yet
    await _register(fast, "none-1")
    got: list[Delivery] = []
    deadline = time.monotonic() + 10
    while not got:
        assert time.monotonic() < deadline, "the matched tenant's run was never read"
        await asyncio.sleep(0.06)
        got = await worker.read(block_ms=50)
    assert [d.tenant for d in got] == ["none-1"]
