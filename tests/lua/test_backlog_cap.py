"""The cap on a ready stream's undelivered entries (max_backlog, lua/lib/park.lua), on
standalone and Cluster: runs past the cap wait in the wheel, parked, still scheduled and
counted; other tenants and the tenant's other queues go on; a reader draining the stream
lets them out oldest first, each once; the tick does not read parked runs again while
the stream stays full; the cap changes live; cancels and the audit see parked runs."""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from timewheel.api import create_app
from timewheel.audit.findings import Kind
from timewheel.dispatch.rates import DispatchRates
from timewheel.engine import Engine
from timewheel.models import Delivery
from timewheel.runs.delivery import parse_entry
from timewheel.tasks.model import NewTask
from timewheel.tenants import Limits, TenantStore
from timewheel.testing.api import assert_error
from timewheel.testing.audit import audit
from timewheel.testing.clock import NOW
from timewheel.testing.dispatch import all_deliveries, prime, running_scheduler
from timewheel.testing.settings import test_settings

SHARD = 0
GROUP = "g"
ADMIN = "tw_admin_" + secrets.token_hex(8)


@pytest.fixture
async def engine(redis_url: str) -> AsyncIterator[Engine]:
    """One shard (every run in it), no default cap: tenants set their own."""
    settings = test_settings(redis_url, admin_key=ADMIN, tenant_max_backlog=0)
    eng = await Engine.connect(dataclasses.replace(settings, shards=1))
    try:
        yield eng
    finally:
        await eng.close()


async def _create(engine: Engine, tenant: str, queue: str, n: int, at: int) -> list[str]:
    """n runs due 1 ms apart from `at`; their ids in due order."""
    made = await engine.tasks.create_many(
        [NewTask(tenant=tenant, queue=queue, run_at_ms=at + i) for i in range(n)]
    )
    return [t.task_id for t in made]


def _stream(engine: Engine, tenant: str, queue: str) -> str:
    return f"{engine.keys.tag(SHARD)}q:{tenant}:{queue}"


async def _read(engine: Engine, stream: str, count: int) -> list[Delivery]:
    """A consumer reads `count` new entries (they become pending: no longer undelivered)."""
    reply: Any = await engine.client.xreadgroup(GROUP, "c1", {stream: ">"}, count=count)
    return [parse_entry(stream, eid, fields) for _, entries in reply for eid, fields in entries]


async def test_runs_past_the_cap_park_and_go_out_in_due_order_as_the_stream_drains(
    engine: Engine,
) -> None:
    await prime(engine)
    caps = DispatchRates.of(engine.store)
    await caps.put_cap("acme", 5)
    due = NOW + 1000
    capped = await _create(engine, "acme", "mail", 12, due)
    other_queue = await _create(engine, "acme", "sms", 4, due)
    other_tenant = await _create(engine, "beta", "mail", 20, due)
    end = due + 20
    stream = _stream(engine, "acme", "mail")

    res = await engine.dispatch.tick(SHARD, now_ms=end)
    assert res.per_tenant == {"acme": 5 + 4, "beta": 20}
    assert (res.parked, res.parked_pairs) == (7, {("acme", "mail"): 7})
    assert await engine.client.xlen(stream) == 5
    waiting = [await engine.tasks.get("acme", task_id) for task_id in capped]
    # In the wheel, not dropped, not sent: as GET and the task list (sent_runs) read it.
    assert [t.state for t in waiting] == ["dispatched"] * 5 + ["scheduled"] * 7
    parked = waiting[5:]
    assert await engine.tasks.sent_runs(SHARD, parked) == set()

    # The stream stays full: the next passes read no parked run (nothing consumed) and
    # the tenant is out of the due index.
    for i in range(3):
        res = await engine.dispatch.tick(SHARD, now_ms=end + 10 * i)
        assert (res.consumed, res.dispatched, res.released, res.parked) == (0, 0, 0, 7)
    assert await engine.client.zscore(engine.keys.due(SHARD), "acme") is None

    # A reader takes 3 entries (pending, no longer undelivered): 3 parked runs go out,
    # the oldest.
    await engine.outcomes.register_group(stream, GROUP)
    first = await _read(engine, stream, 3)
    res = await engine.dispatch.tick(SHARD, now_ms=end + 100)
    assert (res.released, res.dispatched, res.parked) == (3, 3, 4)
    # Everything read and acknowledged: the rest go, and the pair is no longer parked.
    rest = await _read(engine, stream, 100)
    assert await engine.outcomes.ack_many(first + rest, GROUP) == [True] * 8
    res = await engine.dispatch.tick(SHARD, now_ms=end + 200)
    assert (res.released, res.dispatched, res.parked, res.parked_pairs) == (4, 4, 0, {})
    assert await engine.client.exists(engine.keys.parked(SHARD)) == 0

    sent = [d for d in await all_deliveries(engine) if d.tenant == "acme" and d.queue == "mail"]
    run_ids = [d.run_id for d in first + rest] + [d.run_id for d in sent]
    assert run_ids == capped  # each once, in due order
    others = {d.run_id for d in await all_deliveries(engine) if d.run_id not in capped}
    assert others == set(other_queue) | set(other_tenant)


async def test_a_parked_run_can_be_cancelled_and_the_audit_says_backlog(engine: Engine) -> None:
    await prime(engine)
    await DispatchRates.of(engine.store).put_cap("acme", 2)
    ids = await _create(engine, "acme", "mail", 6, NOW)
    res = await engine.dispatch.tick(SHARD, now_ms=NOW + 10)
    assert (res.dispatched, res.parked) == (2, 4)
    await engine.outcomes.register_group(_stream(engine, "acme", "mail"), GROUP)

    report = await audit(engine, NOW + 61_000)
    late = {f.id: f.reason for f in report.findings if f.kind is Kind.OVERDUE}
    assert late == {task_id: "backlog" for task_id in ids[2:]}
    assert report.total == 4, report.findings

    assert (await engine.tasks.cancel("acme", ids[3])).state == "cancelled"
    res = await engine.dispatch.tick(SHARD, now_ms=NOW + 20)
    assert res.parked == 3
    await DispatchRates.of(engine.store).put_cap("acme", 0)  # no cap: the rest go at once
    res = await engine.dispatch.tick(SHARD, now_ms=NOW + 30)
    assert (res.released, res.dispatched, res.parked) == (3, 3, 0)
    sent = [d.run_id for d in await all_deliveries(engine)]
    assert sent == ids[:3] + ids[4:]


async def test_the_deployment_default_applies_unless_the_tenant_sets_its_own(
    redis_url: str,
) -> None:
    settings = test_settings(redis_url, tenant_max_backlog=3)
    engine = await Engine.connect(dataclasses.replace(settings, shards=1))
    try:
        await prime(engine)
        await DispatchRates.of(engine.store).put_cap("free", 0)
        await _create(engine, "acme", "mail", 5, NOW)
        await _create(engine, "free", "mail", 5, NOW)
        res = await engine.dispatch.tick(SHARD, now_ms=NOW + 10)
        assert res.per_tenant == {"acme": 3, "free": 5}
        assert res.parked_pairs == {("acme", "mail"): 2}
    finally:
        await engine.close()


@pytest.fixture
async def api(engine: Engine) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(engine.settings, engine=engine)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://tw", headers={"Authorization": f"Bearer {ADMIN}"}
    ) as c:
        yield c


async def test_the_cap_is_set_live_over_http_and_parked_runs_show(
    engine: Engine, api: httpx.AsyncClient
) -> None:
    made = await api.post("/v1/tenants", json={"id": "acme", "limits": {"max_backlog": 2}})
    assert made.status_code == 201, made.text
    assert made.json()["limits"]["max_backlog"] == 2
    await prime(engine)
    await _create(engine, "acme", "mail", 5, NOW)
    assert (await engine.dispatch.tick(SHARD, now_ms=NOW + 10)).parked == 3
    got = (await api.get("/v1/tenants/acme")).json()
    assert got["parked"] == {"mail": 3}

    changed = await api.patch("/v1/tenants/acme", json={"limits": {"max_backlog": 4}})
    assert changed.status_code == 200, changed.text
    res = await engine.dispatch.tick(SHARD, now_ms=NOW + 20)
    assert (res.released, res.dispatched, res.parked) == (2, 2, 1)
    cleared = await api.patch("/v1/tenants/acme", json={"limits": {"max_backlog": None}})
    assert cleared.json()["limits"]["max_backlog"] is None  # the default: no cap here
    res = await engine.dispatch.tick(SHARD, now_ms=NOW + 30)
    assert (res.released, res.dispatched, res.parked) == (1, 1, 0)
    assert (await api.get("/v1/tenants/acme")).json()["parked"] == {}


@pytest.mark.parametrize("value", [-1, 1.5, "many", 10**13])
async def test_a_bad_cap_is_refused_with_its_field(api: httpx.AsyncClient, value: Any) -> None:
    made = await api.post("/v1/tenants", json={"id": "acme"})
    assert made.status_code == 201
    resp = await api.patch("/v1/tenants/acme", json={"limits": {"max_backlog": value}})
    assert_error(resp, 422, "invalid", "limits.max_backlog")
    bad = await api.post("/v1/tenants", json={"id": "b", "limits": {"max_backlog": value}})
    assert_error(bad, 422, "invalid", "limits.max_backlog")


async def test_a_running_scheduler_lets_parked_runs_out_as_a_reader_drains(
    engine: Engine,
) -> None:
    """Nothing wakes the scheduler when a stream drains: its sweep ticks the shard, and
    each tick puts back what fits. A slow reader gets every run once, in due order."""
    store = TenantStore(
        engine.client,
        engine.keys,
        rates=DispatchRates.of(engine.store),
        placements=engine.store.placements,
    )
    await store.create_tenant("acme", Limits(max_backlog=3))  # the sync keeps its copy
    stream = _stream(engine, "acme", "mail")
    await engine.outcomes.register_group(stream, GROUP)
    now = int(time.time() * 1000)
    ids = await _create(engine, "acme", "mail", 12, now - 100)
    got: list[Delivery] = []
    async with running_scheduler(engine):
        deadline = time.monotonic() + 30
        while len(got) < 12:
            assert time.monotonic() < deadline, f"{len(got)} of 12 read"
            batch = await _read(engine, stream, 2)
            assert await engine.client.xlen(stream) <= 3 + len(batch)  # never past the cap
            got += batch
            if batch:
                await engine.outcomes.ack_many(batch, GROUP)
            await asyncio.sleep(0.05)
    assert [d.run_id for d in got] == ids


async def test_the_schedulers_sync_copies_caps_written_elsewhere(engine: Engine) -> None:
    """A cap set where no copy was written (a restore, a crash between the two writes)
    reaches the shards with the sync; a cleared one leaves them."""
    store = TenantStore(engine.client, engine.keys, placements=engine.store.placements)
    await store.create_tenant("acme", Limits(max_backlog=7))
    caps = DispatchRates.of(engine.store)
    assert await engine.client.hget(engine.keys.caps(SHARD), "acme") is None
    assert await caps.sync() == 1
    assert await engine.client.hget(engine.keys.caps(SHARD), "acme") == b"7"
    await store.update_limits("acme", {"max_backlog": None})
    assert await caps.sync() == 1
    assert await engine.client.hexists(engine.keys.caps(SHARD), "acme") == 0
