"""max_pending is never passed, on standalone Redis and on a Cluster: several api
processes (apps with their own engines, so their own usage caches) creating at once stop
at the limit, because each create call carries its shard's cap of the tenant
(lua/task_create.lua, timewheel/limits.py). With one shard the limit is reached exactly;
spread over four, it is never passed. A refused create writes nothing, and a batch the
caps refuse is refused whole."""

from __future__ import annotations

import asyncio
import math
import secrets
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import httpx
import pytest

from timewheel.api import create_app
from timewheel.engine import Engine
from timewheel.errors import OverLimit
from timewheel.limits import Limiter, Usage
from timewheel.tasks.model import NewTask
from timewheel.testing.api import assert_error
from timewheel.testing.settings import test_settings

ADMIN = "tw_admin_" + secrets.token_hex(8)
PROCESSES = 4


class Cluster:
    """PROCESSES apps over one deployment, each with its own Engine and Limiter."""

    def __init__(
        self, engines: list[Engine], clients: list[httpx.AsyncClient], limiters: list[Limiter]
    ):
        self.engines = engines
        self.clients = clients
        self.limiters = limiters

    async def behind(self, index: int, name: str) -> None:
        """App `index` keeps the usage it reads now for the rest of the test (as within
        its second, however slow the host): the others' creates stay unseen by its check."""
        limiter = self.limiters[index]
        await limiter.usage(name)
        limiter._cache[name].expires = math.inf

    async def tenant(self, **limits: Any) -> tuple[str, dict[str, str]]:
        name = "t" + secrets.token_hex(4)
        admin = {"Authorization": f"Bearer {ADMIN}"}
        api = self.clients[0]
        made = await api.post("/v1/tenants", json={"id": name, "limits": limits}, headers=admin)
        assert made.status_code == 201, made.text
        key = (await api.post(f"/v1/tenants/{name}/keys", headers=admin)).json()["key"]
        return name, {"Authorization": f"Bearer {key}", "x-tenant": name}

    async def held(self, name: str) -> list[int]:
        """The tenant's runs not finished in each shard it has used, as counted in Redis."""
        engine = self.engines[0]
        shards = await engine.store.tenant_shards(name)
        return [
            Usage.from_hash(await engine.client.hgetall(engine.keys.usage(s, name))).runs
            for s in shards
        ]


@pytest.fixture
async def apps(redis_url: str) -> AsyncIterator[Cluster]:
    prefix = "t" + secrets.token_hex(4)
    async with AsyncExitStack() as stack:
        engines, clients, limiters = [], [], []
        for _ in range(PROCESSES):
            settings = test_settings(redis_url, admin_key=ADMIN, prefix=prefix)
            engine = await Engine.connect(settings)
            stack.push_async_callback(engine.close)
            app = create_app(settings, engine=engine)
            limiters.append(app.state.limiter)
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            client = await stack.enter_async_context(
                httpx.AsyncClient(transport=transport, base_url="http://tw")
            )
            engines.append(engine)
            clients.append(client)
        yield Cluster(engines, clients, limiters)


async def race(apps: Cluster, who: dict[str, str], per_process: int) -> list[httpx.Response]:
    """Every app creates `per_process` tasks, all at once."""

    async def one(api: httpx.AsyncClient) -> httpx.Response:
        return await api.post("/v1/tasks", json={"delay": 600}, headers=who)

    return list(
        await asyncio.gather(*(one(api) for api in apps.clients for _ in range(per_process)))
    )


async def listed(api: httpx.AsyncClient, who: dict[str, str]) -> list[str]:
    """Every task id of the tenant, following the cursor."""
    out: list[str] = []
    cursor = None
    for _ in range(100):
        params = {"limit": "100", **({"cursor": cursor} if cursor else {})}
        page = (await api.get("/v1/tasks", params=params, headers=who)).json()
        out += [t["id"] for t in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            return out
    raise AssertionError("the listing did not end")


async def test_racing_processes_stop_exactly_at_max_pending_on_one_shard(apps: Cluster) -> None:
    name, who = await apps.tenant(max_pending=10)
    answers = await race(apps, who, 10)  # 40 creates for 10 places
    made = [r for r in answers if r.status_code == 201]
    refused = [r for r in answers if r.status_code != 201]
    assert len(made) == 10
    for r in refused:
        assert_error(r, 429, "over_limit", "max_pending")
        assert int(r.headers["retry-after"]) >= 1
    assert await apps.held(name) == [10]
    assert sorted(await listed(apps.clients[0], who)) == sorted(r.json()["id"] for r in made)


async def test_racing_processes_never_pass_max_pending_over_four_shards(apps: Cluster) -> None:
    name, who = await apps.tenant(max_pending=10, shards=4)
    answers = await race(apps, who, 10)
    made = [r for r in answers if r.status_code == 201]
    for r in answers:
        if r.status_code != 201:
            assert_error(r, 429, "over_limit", "max_pending")
    held = await apps.held(name)
    assert len(held) == 4
    assert sum(held) == len(made) <= 10
    # No shard past its cap: 10 over 4 shards is 3, 3, 2, 2 in placement order.
    shards = apps.engines[0].store.placements.get(name).shards
    by_shard = dict(zip(await apps.engines[0].store.tenant_shards(name), held, strict=True))
    assert [by_shard[s] for s in shards] == [3, 3, 2, 2]
    # Refused creates went to the shards with room: the limit is reached.
    assert len(made) == 10
    assert sorted(await listed(apps.clients[0], who)) == sorted(r.json()["id"] for r in made)


async def test_a_batch_the_caps_refuse_is_refused_whole(apps: Cluster) -> None:
    """A process whose cached count is behind lets a batch through its check; the shard's
    cap refuses all of it, and nothing of it is written."""
    name, who = await apps.tenant(max_pending=5)
    a, b = apps.clients[0], apps.clients[1]
    # b reads 0 and creates 1; a then creates 2 that b does not see.
    await apps.behind(1, name)
    assert (await b.post("/v1/tasks", json={"delay": 600}, headers=who)).status_code == 201
    for _ in range(2):
        assert (await a.post("/v1/tasks", json={"delay": 600}, headers=who)).status_code == 201
    events = apps.engines[0].keys.events(apps.engines[0].store.shards_of(name)[0])
    entries = await apps.engines[0].client.xlen(events)
    refused = await b.post("/v1/tasks/batch", json={"tasks": [{"delay": 600}] * 3}, headers=who)
    assert_error(refused, 429, "over_limit", "max_pending")
    assert await apps.held(name) == [3]
    assert len(await listed(a, who)) == 3
    assert await apps.engines[0].client.xlen(events) == entries  # no 'created' entry
    fits = await b.post("/v1/tasks/batch", json={"tasks": [{"delay": 600}] * 2}, headers=who)
    assert [r["status"] for r in fits.json()["results"]] == [201, 201]
    assert await apps.held(name) == [5]


async def test_a_batch_over_several_calls_answers_the_refused_ones_each(apps: Cluster) -> None:
    """Past CREATE_CHUNK tasks in a shard a batch is several calls; the caps refuse a
    call that would pass the limit, whose tasks each answer 429, and create the others."""
    name, who = await apps.tenant(max_pending=250)
    a, b = apps.clients[0], apps.clients[1]
    await apps.behind(1, name)
    assert (await b.post("/v1/tasks", json={"delay": 600}, headers=who)).status_code == 201
    ahead = await a.post("/v1/tasks/batch", json={"tasks": [{"delay": 600}] * 99}, headers=who)
    assert ahead.status_code == 200
    # b sees 1 held: 1 + 220 fits its check; in Redis 100 + 200 (the first call) does not.
    answer = await b.post("/v1/tasks/batch", json={"tasks": [{"delay": 600}] * 220}, headers=who)
    assert answer.status_code == 200, answer.text
    statuses = [r["status"] for r in answer.json()["results"]]
    assert statuses.count(429) == 200 and statuses.count(201) == 20
    for r in answer.json()["results"]:
        if r["status"] == 429:
            assert r["error"]["code"] == "over_limit" and r["error"]["field"] == "max_pending"
    assert await apps.held(name) == [120]


async def test_a_refused_create_writes_nothing_and_a_duplicate_at_the_cap_is_found(
    apps: Cluster,
) -> None:
    engine = apps.engines[0]
    name, who = await apps.tenant()
    made = await engine.tasks.create(
        NewTask(name, delay_ms=600_000, idempotency_key="k1"), caps=lambda t, s: 1
    )
    assert made.created
    shard = engine.store.shards_of(name)[0]
    entries = await engine.client.xlen(engine.keys.events(shard))
    fresh = NewTask(name, delay_ms=600_000)
    outcomes = await engine.tasks.create_checked([fresh, fresh], caps=lambda t, s: 1)
    assert all(isinstance(o, OverLimit) and o.field == "max_pending" for o in outcomes)
    with pytest.raises(OverLimit):
        await engine.tasks.create(fresh, caps=lambda t, s: 1)
    assert await engine.client.xlen(engine.keys.events(shard)) == entries
    assert await apps.held(name) == [1]
    assert await listed(apps.clients[0], who) == [made.task_id]
    # An idempotent retry at the cap answers the task it made.
    again = await engine.tasks.create(
        NewTask(name, delay_ms=600_000, idempotency_key="k1"), caps=lambda t, s: 1
    )
    assert not again.created and again.task_id == made.task_id
    # Without caps (an engine used directly) nothing is checked in Redis.
    assert (await engine.tasks.create(fresh)).created
    assert await apps.held(name) == [2]


async def test_runs_left_in_older_shards_come_off_the_cap_of_the_current_one(
    apps: Cluster,
) -> None:
    """A tenant spread over 4 shards, then back to 1: what the 3 older shards hold comes
    off the current one's cap, and racing processes stop exactly at the limit."""
    name, who = await apps.tenant(max_pending=10, shards=4)
    a = apps.clients[0]
    batch = await a.post("/v1/tasks/batch", json={"tasks": [{"delay": 600}] * 8}, headers=who)
    assert [r["status"] for r in batch.json()["results"]] == [201] * 8
    assert await apps.held(name) == [2, 2, 2, 2]  # a batch splits evenly over the shards
    admin = {"Authorization": f"Bearer {ADMIN}"}
    resp = await a.patch(f"/v1/tenants/{name}", json={"limits": {"shards": 1}}, headers=admin)
    assert resp.status_code == 200, resp.text
    for engine in apps.engines:  # every process past its cache of the placement
        await engine.store.placements.load(name, fresh=True)
    answers = await race(apps, who, 5)
    made = [r for r in answers if r.status_code == 201]
    assert len(made) == 2
    for r in answers:
        if r.status_code != 201:
            assert_error(r, 429, "over_limit", "max_pending")
    [current] = resp.json()["shards"]
    assert {r.json()["id"][:3] for r in made} == {f"{current:03x}"}
    assert sum(await apps.held(name)) == 10


async def test_triggers_and_backfills_the_caps_refuse_add_nothing(apps: Cluster) -> None:
    """Runs asked for by hand count for max_pending: a process behind the others lets a
    trigger or a backfill through its check, and the shard's cap refuses it whole."""
    name, who = await apps.tenant(max_pending=3)
    a, b = apps.clients[0], apps.clients[1]
    made = await a.post("/v1/schedules", json={"every_s": 3600}, headers=who)
    sid = made.json()["id"]
    await apps.behind(1, name)
    assert (await b.post(f"/v1/schedules/{sid}/trigger", headers=who)).status_code == 201
    assert (await a.post("/v1/tasks", json={"delay": 600}, headers=who)).status_code == 201
    # b saw 1 held: a backfill of 2 fire times fits its check, not the shard's cap of 3.
    hours = {"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T01:59:59.999Z"}  # 2 fires
    refused = await b.post(f"/v1/schedules/{sid}/backfill", json=hours, headers=who)
    assert_error(refused, 429, "over_limit", "max_pending")
    assert await apps.held(name) == [2]
    assert (await a.post("/v1/tasks", json={"delay": 600}, headers=who)).status_code == 201
    # b still sees 1 held: one more trigger fits its check, not the cap.
    again = await b.post(f"/v1/schedules/{sid}/trigger", headers=who)
    assert_error(again, 429, "over_limit", "max_pending")
    assert await apps.held(name) == [3]  # b's first trigger and a's two tasks
