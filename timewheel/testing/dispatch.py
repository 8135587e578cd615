"""Driving and reading a deployment's dispatch in tests and benches: scheduler passes at a
given clock, a scheduler or a worker run in the background, and every ready stream read
back."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from redis.asyncio.cluster import RedisCluster

from timewheel.dispatch.scheduler import Scheduler
from timewheel.engine import Engine
from timewheel.models import Delivery
from timewheel.runs.delivery import parse_entry
from timewheel.runs.worker import Worker
from timewheel.testing.clock import NOW


async def prime(engine: Engine, now_ms: int = NOW) -> None:
    """Run the promoter once on every shard, as a scheduler does at start."""
    for shard in range(engine.settings.shards):
        await engine.dispatch.promote(shard, now_ms=now_ms)


async def tick_all(engine: Engine, now_ms: int, limit: int | None = None) -> int:
    """Tick every shard once at `now_ms`; returns the runs dispatched."""
    total = 0
    for shard in range(engine.settings.shards):
        total += (await engine.dispatch.tick(shard, now_ms=now_ms, limit=limit)).dispatched
    return total


async def stream_keys(engine: Engine) -> list[str]:
    """Every ready-stream key of the engine's deployment (SCAN on every primary)."""
    pattern = f"{{{engine.settings.prefix}:*}}:q:*"
    client = engine.client
    if isinstance(client, RedisCluster):
        keys: set[str] = set()
        for node in client.get_primaries():
            async for key in client.scan_iter(match=pattern, count=1000, target_nodes=node):
                keys.add(key.decode())
        return sorted(keys)
    return sorted([k.decode() async for k in client.scan_iter(match=pattern, count=1000)])


async def all_deliveries(engine: Engine) -> list[Delivery]:
    """Every entry of every ready stream, in stream order per stream."""
    out: list[Delivery] = []
    for key in await stream_keys(engine):
        last = "-"
        while True:
            entries: Any = await engine.client.xrange(key, min=last, max="+", count=5000)
            if last != "-":
                entries = entries[1:]
            if not entries:
                break
            out.extend(parse_entry(key, eid, fields) for eid, fields in entries)
            last = entries[-1][0].decode()
    return out


async def read_group(
    engine: Engine, tenant: str, group: str, queue: str = "default"
) -> list[Delivery]:
    """What a consumer of `group` reads next from every ready stream of the tenant's pair
    (the group made where it is missing): the runs then pending in it."""
    out: list[Delivery] = []
    for shard in engine.store.shards_of(tenant):
        stream = engine.keys.stream(shard, tenant, queue)
        await engine.outcomes.register_group(stream, group)
        reply: Any = await engine.client.xreadgroup(group, "c", {stream: ">"}, count=1000)
        for name, entries in reply or []:
            key = name.decode() if isinstance(name, bytes) else name
            out.extend(parse_entry(key, eid, f) for eid, f in entries)
    return out


@contextlib.asynccontextmanager
async def running_scheduler(engine: Engine) -> AsyncIterator[Scheduler]:
    """A single-node scheduler running in the background for the duration of the block."""
    stop = asyncio.Event()
    scheduler = Scheduler(engine.store)
    task = asyncio.create_task(scheduler.run(stop))
    try:
        yield scheduler
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=10)


async def work_until(
    worker: Worker, handler: Callable[[Delivery], Any], done: Callable[[], bool], timeout_s: float
) -> None:
    """Run the worker until done() is true (or fail after timeout_s)."""
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(handler, stop))
    deadline = time.monotonic() + timeout_s
    try:
        while not done():
            assert time.monotonic() < deadline, "timed out"
            assert not task.done(), task
            await asyncio.sleep(0.02)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
