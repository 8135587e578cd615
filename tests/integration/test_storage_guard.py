"""The storage guard over HTTP, on standalone Redis and on a Cluster: with Redis past the
guard every create answers 507 storage_full and writes nothing, while dispatch, ack,
fail, cancel, delete and purge go on; the ceiling is maxmemory or storage_max_bytes,
and on a Cluster each node is judged on its own."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from timewheel.api import create_app
from timewheel.engine import Engine
from timewheel.errors import StorageFull
from timewheel.limits import Limiter
from timewheel.runs.worker import Worker
from timewheel.schedules.model import NewSchedule
from timewheel.schedules.spec import ScheduleSpec
from timewheel.store.guard import Reading
from timewheel.store.server import RedisServer
from timewheel.tasks.model import NewTask
from timewheel.testing.api import assert_error, tenant_headers
from timewheel.testing.clock import FakeClock
from timewheel.testing.dispatch import prime, tick_all
from timewheel.testing.redis_cluster import RedisClusterServers
from timewheel.testing.settings import test_settings

TENANT = "acme"


@pytest.fixture
async def engines(redis_url: str) -> AsyncIterator[tuple[Engine, Engine]]:
    """Two engines on one deployment: one as usual, one whose storage guard always trips
    (storage_max_bytes=1)."""
    settings = test_settings(redis_url)
    normal = await Engine.connect(settings)
    full = await Engine.connect(dataclasses.replace(settings, storage_max_bytes=1))
    try:
        yield normal, full
    finally:
        await full.close()
        await normal.close()


@pytest.fixture
async def api(engines: tuple[Engine, Engine]) -> AsyncIterator[httpx.AsyncClient]:
    """The API on the engine whose guard trips, as tenant acme."""
    _, full = engines
    app = create_app(full.settings, engine=full)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    headers = await tenant_headers(full, TENANT)
    async with httpx.AsyncClient(transport=transport, base_url="http://tw", headers=headers) as c:
        yield c


async def snapshot(engine: Engine) -> tuple[Any, int]:
    """What a refused create must leave as it was: the tenant's usage and event logs."""
    usage = await Limiter(engine.store).read(TENANT)
    events = 0
    for shard in range(engine.settings.shards):
        events += await engine.client.xlen(engine.keys.events(shard))
    return usage, events


async def test_every_create_answers_507_and_writes_nothing(
    api: httpx.AsyncClient, engines: tuple[Engine, Engine]
) -> None:
    normal, full = engines
    clock = FakeClock.from_wall_clock()
    await prime(normal, clock.now_ms)
    # A dead letter and a schedule, made while there was room.
    dead = await normal.tasks.create(
        NewTask(tenant=TENANT, delay_ms=0, options={"retry": {"max_attempts": 1}})
    )
    assert await tick_all(normal, clock.advance(1000)) == 1
    worker = Worker(normal.store, TENANT, "default")
    [delivery] = await worker.read(block_ms=100)
    assert await worker.fail(delivery, "nope") == "dead"
    made = await api.post("/v1/tasks", json={"delay": 60})  # guard first: refused
    assert_error(made, 507, "storage_full")
    assert "creates are refused" in made.json()["error"]["message"]
    schedule, _ = await normal.schedules.create(
        NewSchedule(tenant=TENANT, spec=ScheduleSpec(every_s=3600))
    )
    before = await snapshot(full)
    refused = [
        await api.post("/v1/tasks", json={"delay": 60, "payload": "x"}),
        await api.post("/v1/tasks/batch", json={"tasks": [{"delay": 60}] * 3}),
        await api.post("/v1/schedules", json={"every_s": 60}),
        await api.patch(f"/v1/schedules/{schedule.id}", json={"every_s": 120}),
        await api.post(f"/v1/schedules/{schedule.id}/trigger"),
        await api.post(
            f"/v1/schedules/{schedule.id}/backfill",
            json={"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T02:00:00Z"},
        ),
        await api.post(f"/v1/dead-letters/{dead.task_id}/replay"),
    ]
    for resp in refused:
        assert_error(resp, 507, "storage_full")
    assert await snapshot(full) == before  # nothing half-written
    assert (await full.schedules.get(TENANT, schedule.id)).spec.every_s == 3600
    assert (await full.tasks.get(TENANT, dead.task_id)).state == "dead"
    # A create retried after its first answer was lost gets its task back, full or not.
    key = {"delay": 60, "idempotency_key": "made-before"}
    earlier = await normal.tasks.create(
        NewTask(tenant=TENANT, delay_ms=60_000, idempotency_key="made-before")
    )
    again = await api.post("/v1/tasks", json=key)
    assert again.status_code == 200 and again.json()["id"] == earlier.task_id


async def test_dispatch_ack_fail_cancel_and_delete_go_on(
    api: httpx.AsyncClient, engines: tuple[Engine, Engine]
) -> None:
    normal, full = engines
    clock = FakeClock.from_wall_clock()
    await prime(normal, clock.now_ms)
    due = await normal.tasks.create_many(
        [NewTask(tenant=TENANT, delay_ms=0, options={"retry": {"max_attempts": 1}})] * 3
    )
    later = await normal.tasks.create(NewTask(tenant=TENANT, delay_ms=600_000))
    schedule, _ = await normal.schedules.create(
        NewSchedule(tenant=TENANT, spec=ScheduleSpec(every_s=3600))
    )
    with pytest.raises(StorageFull):
        await full.tasks.create(NewTask(tenant=TENANT, delay_ms=0))
    assert await tick_all(full, clock.advance(1000)) == 3  # dispatch
    worker = Worker(full.store, TENANT, "default")
    deliveries = await worker.read(count=10, block_ms=100)
    assert len(deliveries) == 3
    assert await worker.ack(deliveries[0])  # ack
    assert await worker.fail(deliveries[1], "boom") == "dead"  # fail
    cancelled = await api.delete(f"/v1/tasks/{later.task_id}")  # cancel
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    deleted = await api.delete(f"/v1/schedules/{schedule.id}")  # delete
    assert deleted.status_code == 200
    purged = await api.delete(f"/v1/dead-letters/{deliveries[1].run_id}")  # purge
    assert purged.status_code == 200
    acked, in_flight = deliveries[0].run_id, deliveries[2].run_id
    assert (await full.tasks.get(TENANT, acked)).state == "succeeded"
    assert (await full.tasks.get(TENANT, in_flight)).state == "dispatched"
    assert {d.run_id for d in deliveries} == {t.task_id for t in due}
    usage = await Limiter(full.store).read(TENANT)
    assert usage.runs == 1 and usage.schedules == 0  # the one still in flight


async def test_maxmemory_is_the_ceiling_and_the_guard_clears_as_memory_frees(
    own_redis: RedisServer,
) -> None:
    engine = await Engine.connect(test_settings(own_redis.url))
    try:
        info: dict[str, Any] = await engine.client.info("memory")
        used = int(info["used_memory"])
        await engine.client.config_set("maxmemory", str(int(used * 1.05)))
        with pytest.raises(StorageFull) as full:
            await engine.tasks.create(NewTask(tenant=TENANT, delay_ms=60_000))
        assert full.value.ceiling_bytes == int(used * 1.05)
        await engine.client.config_set("maxmemory", "0")
        deadline = time.monotonic() + 5
        while True:  # the guard reads INFO memory again within about a second
            try:
                await engine.tasks.create(NewTask(tenant=TENANT, delay_ms=60_000))
                break
            except StorageFull:
                assert time.monotonic() < deadline, "the guard did not clear"
                await asyncio.sleep(0.2)
    finally:
        await engine.close()


async def test_on_a_cluster_each_node_is_judged_on_its_own(
    redis_cluster: RedisClusterServers,
) -> None:
    engine = await Engine.connect(test_settings(redis_cluster.url))
    try:
        guard = engine.store.guard
        node_of = {s: guard._node_of(s).name for s in range(engine.settings.shards)}
        full_node = node_of[0]
        other = next(s for s, n in node_of.items() if n != full_node)
        # That node read as past the guard: its shards refuse, the others' go on.
        reading = Reading(full_node, 950, 1000, 0.9)
        guard._readings[full_node] = (time.monotonic() + 60, reading)
        with pytest.raises(StorageFull) as refused:
            await guard.check([0])
        assert refused.value.node == full_node
        await guard.check([other])
        with pytest.raises(StorageFull):
            await guard.check([other, 0])  # a batch over both writes nothing
    finally:
        await engine.close()


async def test_the_api_reports_how_full_redis_is(
    api: httpx.AsyncClient, engines: tuple[Engine, Engine]
) -> None:
    body = (await api.get("/metrics")).text
    [line] = [x for x in body.splitlines() if x.startswith("timewheel_storage_used_ratio ")]
    assert float(line.split()[1]) > 1  # used memory over a ceiling of 1 byte
    normal, _ = engines
    app = create_app(normal.settings, engine=normal)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://tw") as c:
        body = (await c.get("/metrics")).text
    [line] = [x for x in body.splitlines() if x.startswith("timewheel_storage_used_ratio ")]
    assert line.split()[1] == "NaN"  # no maxmemory and no storage_max_bytes: no ceiling
