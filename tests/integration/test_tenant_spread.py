"""A tenant's shard spread (the limit `shards`) over HTTP, on standalone Redis and on a
Cluster: changed live under a running worker (its older runs still dispatched and acked
from their shards, the new ones spread over the new set, the worker reading the union
without a restart), listing, get and cancel across old and new shards, max_pending
summed over them, the dispatch rate split over every shard used, distinct primaries on
a Cluster, and the validation answers."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from timewheel.api import create_app
from timewheel.dispatch.rates import DispatchRates
from timewheel.engine import Engine
from timewheel.ids import shard_of
from timewheel.limits import Limiter
from timewheel.models import Delivery
from timewheel.runs.worker import Worker
from timewheel.testing.api import assert_error
from timewheel.testing.dispatch import running_scheduler
from timewheel.testing.redis_cluster import RedisClusterServers
from timewheel.testing.settings import executor_settings, test_settings

ADMIN = "tw_admin_" + secrets.token_hex(8)
AS_ADMIN = {"Authorization": f"Bearer {ADMIN}"}


@pytest.fixture
async def engine(redis_url: str) -> AsyncIterator[Engine]:
    eng = await Engine.connect(executor_settings(redis_url, admin_key=ADMIN, shards=8))
    try:
        yield eng
    finally:
        await eng.close()


@pytest.fixture
async def api(engine: Engine) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(engine.settings, engine=engine)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://tw") as c:
        yield c


async def tenant(api: httpx.AsyncClient, **limits: Any) -> tuple[str, dict[str, str]]:
    """A new tenant with these limits; its name and headers with a key of it."""
    name = "t" + secrets.token_hex(4)
    made = await api.post("/v1/tenants", json={"id": name, "limits": limits}, headers=AS_ADMIN)
    assert made.status_code == 201, made.text
    key = (await api.post(f"/v1/tenants/{name}/keys", headers=AS_ADMIN)).json()["key"]
    return name, {"Authorization": f"Bearer {key}"}


async def spread(api: httpx.AsyncClient, name: str, shards: int | None) -> dict[str, Any]:
    resp = await api.patch(
        f"/v1/tenants/{name}", json={"limits": {"shards": shards}}, headers=AS_ADMIN
    )
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


async def create(api: httpx.AsyncClient, who: dict[str, str], n: int, delay: float) -> list[str]:
    out = []
    for _ in range(n):
        resp = await api.post("/v1/tasks", json={"delay": delay}, headers=who)
        assert resp.status_code == 201, resp.text
        out.append(resp.json()["id"])
    return out


async def listed(api: httpx.AsyncClient, who: dict[str, str], **query: str) -> list[str]:
    """Every task id of the tenant (filtered by `query`), following the cursor (pages of 3)."""
    out: list[str] = []
    cursor = None
    for _ in range(100):
        params = {"limit": "3", **query, **({"cursor": cursor} if cursor else {})}
        page = (await api.get("/v1/tasks", params=params, headers=who)).json()
        out += [t["id"] for t in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            return out
    raise AssertionError("the listing did not end")


async def test_spread_changes_live_under_a_running_worker(
    engine: Engine, api: httpx.AsyncClient
) -> None:
    name, who = await tenant(api)
    first = await api.get(f"/v1/tenants/{name}", headers=AS_ADMIN)
    assert first.json()["shards"] == first.json()["shards_used"]
    [old_shard] = first.json()["shards"]
    handled: dict[str, int] = {}

    def handler(d: Delivery) -> None:
        handled[d.run_id] = handled.get(d.run_id, 0) + 1

    worker = Worker(engine.store, name, "default", concurrency=4)
    stop = asyncio.Event()
    async with running_scheduler(engine):
        running = asyncio.create_task(worker.run(handler, stop))
        try:
            old = await create(api, who, 10, 1.5)  # due after the change
            assert {shard_of(t) for t in old} == {old_shard}
            body = await spread(api, name, 4)
            new_set = body["shards"]
            assert len(new_set) == 4 and old_shard in body["shards_used"]
            assert set(new_set) <= set(body["shards_used"])
            new = await create(api, who, 40, 0)
            assert {shard_of(t) for t in new} == set(new_set)
            deadline = time.monotonic() + 30
            while len(handled) < 50:
                assert time.monotonic() < deadline, f"handled {len(handled)} of 50"
                assert not running.done(), running
                await asyncio.sleep(0.05)
        finally:
            stop.set()
            await asyncio.wait_for(running, 10)
    assert set(handled) == set(old) | set(new)
    assert not running.exception()
    streams = {engine.keys.stream(s, name, "default") for s in body["shards_used"]}
    assert set(worker.streams) == streams  # the same worker took up the new streams
    for task_id in old + new:
        got = (await api.get(f"/v1/tasks/{task_id}", headers=who)).json()
        assert got["state"] == "succeeded", got


async def test_listing_get_and_cancel_across_old_and_new_shards(
    engine: Engine, api: httpx.AsyncClient
) -> None:
    name, who = await tenant(api, shards=1)
    old = await create(api, who, 4, 600)
    body = await spread(api, name, 4)
    new = await create(api, who, 12, 600)
    assert len({shard_of(t) for t in new}) > 1
    # Back to the default spread: the union keeps every shard the tenant has used.
    smaller = await spread(api, name, None)
    assert smaller["limits"]["shards"] is None
    assert smaller["shards_used"] == body["shards_used"]
    newest = await create(api, who, 2, 600)
    assert {shard_of(t) for t in newest} <= set(smaller["shards"])
    every = old + new + newest
    assert sorted(await listed(api, who)) == sorted(every)
    for task_id in every:
        assert (await api.get(f"/v1/tasks/{task_id}", headers=who)).status_code == 200
    for task_id in (old[0], new[0], newest[0]):
        cancelled = await api.delete(f"/v1/tasks/{task_id}", headers=who)
        assert cancelled.status_code == 200, cancelled.text
        got = (await api.get(f"/v1/tasks/{task_id}", headers=who)).json()
        assert got["state"] == "cancelled"
    scheduled = await listed(api, who, state="scheduled")
    assert sorted(scheduled) == sorted(set(every) - {old[0], new[0], newest[0]})


async def test_an_idempotency_key_finds_its_task_across_a_spread_change(
    engine: Engine, api: httpx.AsyncClient
) -> None:
    """A create retried after the tenant's spread changed finds the task its first try
    made in the old shard (200, same id), single and in a batch, and does not double it."""
    name, who = await tenant(api, shards=1)
    keys = [f"k{i}" for i in range(12)]
    first = {}
    for key in keys:
        resp = await api.post(
            "/v1/tasks", json={"delay": 600}, headers={**who, "Idempotency-Key": key}
        )
        assert resp.status_code == 201, resp.text
        first[key] = resp.json()["id"]
    body = await spread(api, name, 8)
    assert len(body["shards_used"]) == 8
    # Under the new placement most of these keys name other shards than their tasks'.
    again = {}
    for key in keys[:6]:
        resp = await api.post(
            "/v1/tasks", json={"delay": 600}, headers={**who, "Idempotency-Key": key}
        )
        assert resp.status_code == 200, resp.text
        again[key] = resp.json()["id"]
    batch = {"tasks": [{"delay": 600, "idempotency_key": key} for key in keys[6:]]}
    resp = await api.post("/v1/tasks/batch", json=batch, headers=who)
    assert resp.status_code == 200, resp.text
    for key, item in zip(keys[6:], resp.json()["results"], strict=True):
        assert item["status"] == 200, item
        again[key] = item["task"]["id"]
    assert again == first
    assert sorted(await listed(api, who)) == sorted(first.values())
    # A new key goes to the new placement as before.
    fresh = await api.post(
        "/v1/tasks", json={"delay": 600}, headers={**who, "Idempotency-Key": "new"}
    )
    assert fresh.status_code == 201


async def test_max_pending_counts_runs_in_every_shard_used(
    engine: Engine, api: httpx.AsyncClient
) -> None:
    name, who = await tenant(api, max_pending=12)
    await create(api, who, 4, 600)
    await spread(api, name, 4)
    made = await create(api, who, 8, 600)
    assert len({shard_of(t) for t in made}) > 1
    refused = await api.post("/v1/tasks", json={"delay": 600}, headers=who)
    assert_error(refused, 429, "over_limit", "max_pending")
    # A process that never saw the creates reads the same 12 over the union of shards.
    assert (await Limiter(engine.store).read(name)).runs == 12
    await api.delete(f"/v1/tasks/{made[0]}", headers=who)
    assert (await api.post("/v1/tasks", json={"delay": 600}, headers=who)).status_code == 201


async def test_new_schedules_go_to_the_new_shards(engine: Engine, api: httpx.AsyncClient) -> None:
    name, who = await tenant(api)
    body = await spread(api, name, 4)
    made = []
    for _ in range(12):
        resp = await api.post("/v1/schedules", json={"every_s": 3600}, headers=who)
        assert resp.status_code == 201, resp.text
        made.append(resp.json()["id"])
    assert {shard_of(s) for s in made} <= set(body["shards"])
    assert len({shard_of(s) for s in made}) > 1
    page = (await api.get("/v1/schedules", params={"limit": "100"}, headers=who)).json()
    assert sorted(s["id"] for s in page["items"]) == sorted(made)


async def _rates(engine: Engine, name: str) -> dict[int, str]:
    out = {}
    for shard in range(engine.settings.shards):
        raw = await engine.client.hget(engine.keys.rates(shard), name)
        if raw is not None:
            out[shard] = raw.decode() if isinstance(raw, bytes) else str(raw)
    return out


async def test_the_dispatch_rate_is_split_over_every_shard_used(
    engine: Engine, api: httpx.AsyncClient
) -> None:
    name, _ = await tenant(api, dispatch_rate=8)
    [base] = (await api.get(f"/v1/tenants/{name}", headers=AS_ADMIN)).json()["shards"]
    assert await _rates(engine, name) == {base: "8"}
    body = await spread(api, name, 4)
    assert await _rates(engine, name) == {s: "2" for s in body["shards_used"]}
    await spread(api, name, 1)  # the union stays 4 shards: so do the shares
    assert await _rates(engine, name) == {s: "2" for s in body["shards_used"]}
    assert await DispatchRates.of(engine.store).sync() == 0  # the sync agrees


async def test_validation_errors(engine: Engine, api: httpx.AsyncClient) -> None:
    name, _ = await tenant(api)
    for value, code in ((0, "invalid"), (9, "too_many_shards"), ("4", "invalid")):
        resp = await api.patch(
            f"/v1/tenants/{name}", json={"limits": {"shards": value}}, headers=AS_ADMIN
        )
        assert resp.status_code == 422, resp.text
        assert resp.json()["error"]["field"] == "limits.shards", resp.text
        if code != "invalid":
            assert_error(resp, 422, code, "limits.shards")
    made = await api.post(
        "/v1/tenants", json={"id": "x" + name, "limits": {"shards": 9}}, headers=AS_ADMIN
    )
    assert_error(made, 422, "too_many_shards", "limits.shards")
    assert (await api.get(f"/v1/tenants/x{name}", headers=AS_ADMIN)).status_code == 404
    # The deployment's own size is allowed.
    assert len((await spread(api, name, 8))["shards"]) == 8


async def test_on_a_cluster_a_spread_of_3_lands_on_3_primaries(
    redis_cluster: RedisClusterServers,
) -> None:
    settings = test_settings(redis_cluster.url, admin_key=ADMIN, shards=16)
    engine = await Engine.connect(settings)
    try:
        app = create_app(settings, engine=engine)
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://tw") as c:
            for _ in range(5):  # several names: not one lucky hash
                name, _ = await tenant(c, shards=3)
                got = (await c.get(f"/v1/tenants/{name}", headers=AS_ADMIN)).json()
                client = engine.client
                nodes = {
                    client.get_node_from_key(engine.keys.meta(s)).name  # type: ignore[union-attr]
                    for s in got["shards"]
                }
                assert len(got["shards"]) == 3 and len(nodes) == 3, got
    finally:
        await engine.close()


async def test_concurrent_creates_share_one_read_of_the_tenant_s_shards(
    engine: Engine, api: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, _ = await tenant(api, shards=4)
    placements, reads = engine.store.placements, []
    real = placements.client.hmget

    async def counting(*args: Any, **kwargs: Any) -> Any:
        reads.append(args)
        return await real(*args, **kwargs)

    monkeypatch.setattr(placements.client, "hmget", counting)
    placements._cache.clear()
    got = await asyncio.gather(*(placements.load(name) for _ in range(20)))
    assert len(reads) == 1 and {len(p.shards) for p in got} == {4}
    await placements.load(name)  # fresh for a second: no read
    assert len(reads) == 1
    await placements.load(name, fresh=True)
    assert len(reads) == 2
