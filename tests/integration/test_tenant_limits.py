"""Tenant limits over HTTP, on standalone Redis and on a Cluster: each limit taken to the
edge (the last create in fits, one more is refused and nothing of it is written), the
deployment's defaults for a tenant that sets nothing, a tenant's own values over them,
and one tenant's limits leaving another's creates alone."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from timewheel.api import create_app
from timewheel.engine import Engine
from timewheel.errors import OverLimit
from timewheel.limits import Limiter, Usage
from timewheel.tenants import Limits, TenantStore
from timewheel.testing.api import assert_error
from timewheel.testing.settings import test_settings

ADMIN = "tw_admin_" + secrets.token_hex(8)
DEFAULTS = {
    "tenant_max_pending": 3,
    "tenant_max_payload_total_bytes": 100,
    "tenant_max_schedules": 2,
    "tenant_max_queues": 2,
    "tenant_min_interval_s": 60.0,
}


@pytest.fixture
async def engine(redis_url: str) -> AsyncIterator[Engine]:
    """An engine whose tenants get small default limits (DEFAULTS)."""
    eng = await Engine.connect(test_settings(redis_url, admin_key=ADMIN, **DEFAULTS))
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


async def tenant(api: httpx.AsyncClient, **limits: Any) -> dict[str, str]:
    """A new tenant with these limits of its own; headers with a key of it."""
    name = "t" + secrets.token_hex(4)
    admin = {"Authorization": f"Bearer {ADMIN}"}
    made = await api.post("/v1/tenants", json={"id": name, "limits": limits}, headers=admin)
    assert made.status_code == 201, made.text
    key = (await api.post(f"/v1/tenants/{name}/keys", headers=admin)).json()["key"]
    return {"Authorization": f"Bearer {key}", "x-tenant": name}


async def task_ids(api: httpx.AsyncClient, who: dict[str, str]) -> list[str]:
    page = (await api.get("/v1/tasks?limit=100", headers=who)).json()
    return [t["id"] for t in page["items"]]


def over(resp: httpx.Response, limit: str, *, retry_after: bool = True) -> None:
    assert_error(resp, 429, "over_limit", limit)
    assert ("retry-after" in resp.headers) is retry_after
    if retry_after:
        assert int(resp.headers["retry-after"]) >= 1


async def test_max_pending_defaults_for_a_tenant_that_sets_nothing(
    api: httpx.AsyncClient,
) -> None:
    who = await tenant(api)
    made = [await api.post("/v1/tasks", json={"delay": 60}, headers=who) for _ in range(3)]
    assert [r.status_code for r in made] == [201, 201, 201]
    over(await api.post("/v1/tasks", json={"delay": 60}, headers=who), "max_pending")
    assert len(await task_ids(api, who)) == 3  # the refused create wrote nothing
    # A cancel frees a place at once.
    await api.delete(f"/v1/tasks/{made[0].json()['id']}", headers=who)
    assert (await api.post("/v1/tasks", json={"delay": 60}, headers=who)).status_code == 201


async def test_a_tenants_own_limit_beats_the_default_and_null_restores_it(
    api: httpx.AsyncClient,
) -> None:
    who = await tenant(api, max_pending=5)
    for _ in range(5):
        assert (await api.post("/v1/tasks", json={"delay": 60}, headers=who)).status_code == 201
    over(await api.post("/v1/tasks", json={"delay": 60}, headers=who), "max_pending")
    admin = {"Authorization": f"Bearer {ADMIN}"}
    name = who["x-tenant"]
    changed = await api.patch(
        f"/v1/tenants/{name}", json={"limits": {"max_pending": 6}}, headers=admin
    )
    assert changed.json()["limits"]["max_pending"] == 6
    assert (await api.post("/v1/tasks", json={"delay": 60}, headers=who)).status_code == 201
    cleared = await api.patch(
        f"/v1/tenants/{name}", json={"limits": {"max_pending": None}}, headers=admin
    )
    assert cleared.json()["limits"]["max_pending"] is None  # the default (3) again
    over(await api.post("/v1/tasks", json={"delay": 60}, headers=who), "max_pending")


async def test_a_batch_past_a_limit_is_refused_whole_and_per_item_errors_stay(
    api: httpx.AsyncClient,
) -> None:
    who = await tenant(api)
    four = {"tasks": [{"delay": 60}] * 4}
    over(await api.post("/v1/tasks/batch", json=four, headers=who), "max_pending")
    assert await task_ids(api, who) == []
    mixed = {"tasks": [{"delay": 60}, {"run_at": "never"}, {"delay": 60}, {"delay": 60}]}
    resp = await api.post("/v1/tasks/batch", json=mixed, headers=who)
    assert [r["status"] for r in resp.json()["results"]] == [201, 422, 201, 201]
    over(
        await api.post("/v1/tasks/batch", json={"tasks": [{"delay": 1}]}, headers=who),
        "max_pending",
    )


async def test_max_payload_total_bytes_counts_what_is_held(api: httpx.AsyncClient) -> None:
    who = await tenant(api)
    forty = "x" * 38  # a JSON string of 40 bytes
    first = await api.post("/v1/tasks", json={"delay": 60, "payload": forty}, headers=who)
    second = await api.post("/v1/tasks", json={"delay": 60, "payload": forty}, headers=who)
    assert (first.status_code, second.status_code) == (201, 201)
    third = await api.post("/v1/tasks", json={"delay": 60, "payload": forty}, headers=who)
    over(third, "max_payload_total_bytes")
    small = await api.post("/v1/tasks", json={"delay": 60, "payload": "x" * 18}, headers=who)
    assert small.status_code == 201  # exactly 100 bytes held: at the limit is fine
    grown = await api.patch(
        f"/v1/tasks/{first.json()['id']}", json={"payload": forty + "y"}, headers=who
    )
    over(grown, "max_payload_total_bytes")
    assert (await api.get(f"/v1/tasks/{first.json()['id']}", headers=who)).json()[
        "payload"
    ] == forty
    await api.delete(f"/v1/tasks/{first.json()['id']}", headers=who)
    again = await api.post("/v1/tasks", json={"delay": 60, "payload": forty}, headers=who)
    assert again.status_code == 201


async def test_max_queues_counts_queues_in_use(api: httpx.AsyncClient) -> None:
    who = await tenant(api, max_pending=100)
    a = await api.post("/v1/tasks", json={"delay": 60, "queue": "a"}, headers=who)
    b = await api.post("/v1/tasks", json={"delay": 60, "queue": "b"}, headers=who)
    assert (a.status_code, b.status_code) == (201, 201)
    over(await api.post("/v1/tasks", json={"delay": 60, "queue": "c"}, headers=who), "max_queues")
    more = await api.post("/v1/tasks", json={"delay": 60, "queue": "a"}, headers=who)
    assert more.status_code == 201  # a queue in use takes more
    await api.delete(f"/v1/tasks/{b.json()['id']}", headers=who)  # b's last run: b is free
    c = await api.post("/v1/tasks", json={"delay": 60, "queue": "c"}, headers=who)
    assert c.status_code == 201


async def test_max_schedules_and_min_interval(api: httpx.AsyncClient) -> None:
    who = await tenant(api)
    fast = await api.post("/v1/schedules", json={"every_s": 30}, headers=who)
    assert_error(fast, 422, "interval_too_short", "every_s")
    per_second = await api.post("/v1/schedules", json={"cron": "*/10 * * * * *"}, headers=who)
    assert_error(per_second, 422, "interval_too_short", "cron")
    two_close = await api.post("/v1/schedules", json={"cron": "0,1 * * * *"}, headers=who)
    assert two_close.status_code == 201  # 60 s apart at its closest: at the limit is fine
    hourly = await api.post("/v1/schedules", json={"every_s": 3600}, headers=who)
    assert hourly.status_code == 201
    third = await api.post("/v1/schedules", json={"every_s": 3600}, headers=who)
    over(third, "max_schedules", retry_after=False)  # only a delete frees a place
    listed = (await api.get("/v1/schedules", headers=who)).json()["items"]
    assert len(listed) == 2
    sid = hourly.json()["id"]
    closer = await api.patch(f"/v1/schedules/{sid}", json={"every_s": 10}, headers=who)
    assert_error(closer, 422, "interval_too_short", "every_s")
    assert (await api.get(f"/v1/schedules/{sid}", headers=who)).json()["every_s"] == 3600
    await api.delete(f"/v1/schedules/{sid}", headers=who)
    assert (await api.post("/v1/schedules", json={"every_s": 60}, headers=who)).status_code == 201
    # A tenant's own min_interval_s beats the default: a per-second cron is fine there.
    quick = await tenant(api, min_interval_s=1)
    ok = await api.post("/v1/schedules", json={"cron": "* * * * * *"}, headers=quick)
    assert ok.status_code == 201, ok.text


async def test_a_schedules_queue_and_payload_count_and_hand_runs_count_as_tasks(
    api: httpx.AsyncClient,
) -> None:
    who = await tenant(api)
    made = await api.post(
        "/v1/schedules", json={"every_s": 3600, "queue": "a", "payload": "p"}, headers=who
    )
    sid = made.json()["id"]
    big = {"every_s": 60, "queue": "b", "payload": "x" * 100}
    over(await api.post("/v1/schedules", json=big, headers=who), "max_payload_total_bytes")
    for queue in ("a", "b"):
        task = await api.post("/v1/tasks", json={"delay": 60, "queue": queue}, headers=who)
        assert task.status_code == 201
    moved = await api.patch(f"/v1/schedules/{sid}", json={"queue": "c"}, headers=who)
    over(moved, "max_queues")  # a (still held by a task) and b are in use; c is a third
    assert (await api.get(f"/v1/schedules/{sid}", headers=who)).json()["queue"] == "a"
    assert (await api.post(f"/v1/schedules/{sid}/trigger", headers=who)).status_code == 201
    over(await api.post(f"/v1/schedules/{sid}/trigger", headers=who), "max_pending")
    backfill = await api.post(
        f"/v1/schedules/{sid}/backfill",
        json={"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T01:00:00Z"},
        headers=who,
    )
    over(backfill, "max_pending")


async def test_one_tenants_limit_leaves_another_alone(
    api: httpx.AsyncClient, engine: Engine
) -> None:
    full = await tenant(api, max_pending=1)
    other = await tenant(api)
    assert (await api.post("/v1/tasks", json={"delay": 60}, headers=full)).status_code == 201
    over(await api.post("/v1/tasks", json={"delay": 60}, headers=full), "max_pending")
    for _ in range(3):
        assert (await api.post("/v1/tasks", json={"delay": 60}, headers=other)).status_code == 201
    usage = await Limiter(engine.store).read(full["x-tenant"])
    assert (usage.runs, dict(usage.queues)) == (1, {"default": 1})


async def test_an_idempotent_retry_at_the_limit_gets_its_task(api: httpx.AsyncClient) -> None:
    who = await tenant(api, max_pending=1)
    body = {"delay": 60, "idempotency_key": "once"}
    first = await api.post("/v1/tasks", json=body, headers=who)
    again = await api.post("/v1/tasks", json=body, headers=who)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    sched = {"every_s": 3600, "idempotency_key": "s"}
    made = [await api.post("/v1/schedules", json=sched, headers=who) for _ in range(2)]
    other = await api.post("/v1/schedules", json={"every_s": 3600}, headers=who)
    assert [r.status_code for r in made] == [201, 200]
    assert other.status_code == 201
    repeat = await api.post("/v1/schedules", json=sched, headers=who)
    assert repeat.status_code == 200 and repeat.json()["id"] == made[0].json()["id"]


async def test_usage_adds_up_over_a_tenants_shards(redis_url: str) -> None:
    settings = test_settings(redis_url, admin_key=ADMIN, default_spread=4, **DEFAULTS)
    engine = await Engine.connect(settings)
    try:
        app = create_app(settings, engine=engine)
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://tw") as c:
            who = await tenant(c, max_pending=12)
            batch = {"tasks": [{"delay": 60}] * 12}
            assert (await c.post("/v1/tasks/batch", json=batch, headers=who)).status_code == 200
            over(await c.post("/v1/tasks", json={"delay": 60}, headers=who), "max_pending")
        name = who["x-tenant"]
        per_shard = [
            Usage.from_hash(await engine.client.hgetall(engine.keys.usage(shard, name))).runs
            for shard in engine.store.shards_of(name)
        ]
        assert sum(per_shard) == 12 and sum(1 for n in per_shard if n) > 1  # several shards
        assert (await Limiter(engine.store).read(name)).runs == 12
    finally:
        await engine.close()


async def test_a_write_counted_by_a_read_and_by_its_note_refuses_nothing(
    engine: Engine,
) -> None:
    """A create's note can land on a read that already counted its write (the read sent
    while the write's reply was on its way): the cached count then runs ahead of Redis.
    A check refuses only what a read of its own confirms; a count with nothing noted on
    it refuses without one."""
    name = "t" + secrets.token_hex(4)
    tenant = await TenantStore(engine.client, engine.keys).create_tenant(
        name, Limits(max_schedules=3)
    )
    limiter = Limiter(engine.store)
    [shard] = engine.store.shards_of(name)
    key = engine.keys.usage(shard, name)
    await limiter.check(tenant, Usage(schedules=1))  # reads 0
    # two creates' writes land; a read after them counts them, and their notes arrive late
    await engine.client.hincrby(key, "schedules", 2)
    limiter._cache[name].expires = 0
    assert (await limiter.usage(name)).schedules == 2
    limiter.note(name, Usage(schedules=2))
    assert (await limiter.usage(name)).schedules == 4  # ahead of Redis's 2
    await limiter.check(tenant, Usage(schedules=1))  # 3 of 3: fits
    assert (await limiter.usage(name)).schedules == 2  # the check's own read is kept
    # at the limit for real: refused, by the cached count alone once nothing is noted
    await engine.client.hincrby(key, "schedules", 1)
    limiter._cache[name].expires = 0
    reads = 0
    real_read = limiter._read

    async def counted(tenant_id: str) -> Any:
        nonlocal reads
        reads += 1
        return await real_read(tenant_id)

    limiter._read = counted  # type: ignore[method-assign]
    for _ in range(3):
        with pytest.raises(OverLimit) as refused:
            await limiter.check(tenant, Usage(schedules=1))
        assert refused.value.field == "max_schedules"
    assert reads == 1
