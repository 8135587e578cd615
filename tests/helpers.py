"""Helpers shared by tests: reading every ready stream of a deployment, running a scheduler."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from redis.asyncio.cluster import RedisCluster

from timewheel.dispatch.scheduler import Scheduler
from timewheel.engine import Engine
from timewheel.models import Delivery
from timewheel.runs.delivery import parse_entry


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
