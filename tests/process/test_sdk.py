"""Every endpoint through the SDK against a real api process and redis-server: happy
paths, each error code, tenant isolation and admin-only endpoints."""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import redis

from timewheel.engine import Engine
from timewheel.errors import (
    ApiError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitedError,
    TransportError,
    UnprocessableError,
)
from timewheel.runs.worker import Worker
from timewheel.sdk.client import AsyncClient, Client, raise_for
from timewheel.store.keys import Keys
from timewheel.store.server import find_free_port
from timewheel.testing.apiserver import ApiServer
from timewheel.testing.clock import FakeClock
from timewheel.testing.dispatch import prime, tick_all


def _name(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


@pytest.fixture
def admin(api_server: ApiServer) -> Iterator[Client]:
    with Client(api_server.url, api_server.admin_key) as c:
        yield c


class TenantClient(Client):
    """A client with a tenant's key, and that tenant's name (for the test's own checks)."""

    def __init__(self, url: str, key: str, tenant: str):
        super().__init__(url, key)
        self.tenant = tenant


def tenant_client(
    api_server: ApiServer,
    admin: Client,
    tenant: str,
    max_payload_bytes: int | None = None,
    max_pending: int | None = None,
) -> TenantClient:
    admin.create_tenant(tenant, max_payload_bytes=max_payload_bytes, max_pending=max_pending)
    return TenantClient(api_server.url, admin.create_key(tenant)["key"], tenant)


@pytest.fixture
def acme(api_server: ApiServer, admin: Client) -> Iterator[TenantClient]:
    with tenant_client(api_server, admin, _name("acme")) as c:
        yield c


@pytest.fixture
def globex(api_server: ApiServer, admin: Client) -> Iterator[TenantClient]:
    with tenant_client(api_server, admin, _name("globex")) as c:
        yield c


@pytest.fixture
async def engine(api_server: ApiServer) -> AsyncIterator[Engine]:
    eng = await Engine.connect(api_server.settings)
    try:
        yield eng
    finally:
        await eng.close()


def _auth(client: Client) -> dict[str, str]:
    return {"Authorization": f"Bearer {client.key}"}


def _err(exc: pytest.ExceptionInfo[ApiError], status: int, code: str) -> None:
    assert (exc.value.status, exc.value.code) == (status, code), str(exc.value)
    assert exc.value.message


UNSET_LIMITS = dict.fromkeys(
    (
        "max_payload_bytes",
        "max_pending",
        "dispatch_rate",
        "max_payload_total_bytes",
        "max_schedules",
        "max_queues",
        "min_interval_s",
        "shards",
        "max_backlog",
    )
)
"""A tenant's limits with none of its own set (each the deployment's default)."""


def test_tenant_and_key_admin(api_server: ApiServer, admin: Client) -> None:
    name = _name("t")
    created = admin.create_tenant(
        name, max_pending=10, max_payload_bytes=1000, dispatch_rate=5, max_queues=4
    )
    assert created["id"] == name
    assert created["limits"] == {
        **UNSET_LIMITS,
        "max_pending": 10,
        "max_payload_bytes": 1000,
        "dispatch_rate": 5,
        "max_queues": 4,
    }
    assert admin.get_tenant(name)["limits"]["dispatch_rate"] == 5
    # The tick enforces it from copies in the tenant's shards, which add up to the rate.
    assert sum(_rate_shares(api_server, name)) == pytest.approx(5)
    with pytest.raises(ConflictError) as conflict:
        admin.create_tenant(name)
    _err(conflict, 409, "conflict")
    with pytest.raises(UnprocessableError) as bad:
        admin.create_tenant("no spaces")
    assert bad.value.field == "id"
    with pytest.raises(UnprocessableError) as bad_limit:
        admin.create_tenant(_name("t"), max_pending=0)
    assert bad_limit.value.field == "limits.max_pending"
    with pytest.raises(UnprocessableError) as over_deployment:
        admin.create_tenant(_name("t"), max_payload_bytes=10**7)
    assert over_deployment.value.field == "limits.max_payload_bytes"
    with pytest.raises(BadRequestError) as malformed:
        raise_for(
            httpx.post(f"{api_server.url}/v1/tenants", content=b"{nope", headers=_auth(admin))
        )
    _err(malformed, 400, "malformed_json")
    with pytest.raises(NotFoundError):
        admin.get_tenant(_name("missing"))
    with pytest.raises(NotFoundError):
        admin.create_key(_name("missing"))
    key = admin.create_key(name)
    assert key["key"].startswith("tw_") and key["tenant"] == name
    with Client(api_server.url, key["key"]) as tenant:
        assert tenant.list_tasks()["items"] == []
        assert admin.revoke_key(name, key["key_id"]) == {"key_id": key["key_id"], "revoked": True}
        with pytest.raises(NotFoundError):
            admin.revoke_key(name, key["key_id"])
        deadline = time.monotonic() + 10
        while True:  # the api caches a key for about a second
            try:
                tenant.list_tasks()
            except AuthenticationError:
                break
            assert time.monotonic() < deadline, "revoked key still works"
            time.sleep(0.2)


def in_future(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


def _rate_shares(api_server: ApiServer, tenant: str) -> list[float]:
    settings = api_server.settings
    with redis.Redis.from_url(settings.redis_url) as r:
        values = [r.hget(Keys(settings.prefix).rates(s), tenant) for s in range(settings.shards)]
    return [float(v) for v in values if v is not None]


def test_tenant_limits_change_and_clear(api_server: ApiServer, admin: Client) -> None:
    name = _name("t")
    admin.create_tenant(name, max_pending=10, dispatch_rate=5)
    changed = admin.update_tenant(name, {"dispatch_rate": 50})
    assert changed["limits"] == {**UNSET_LIMITS, "max_pending": 10, "dispatch_rate": 50}
    assert admin.get_tenant(name)["limits"] == changed["limits"]
    assert sum(_rate_shares(api_server, name)) == pytest.approx(50)
    cleared = admin.update_tenant(name, {"dispatch_rate": None, "max_pending": None})
    assert set(cleared["limits"].values()) == {None}
    assert _rate_shares(api_server, name) == []

    with pytest.raises(NotFoundError):
        admin.update_tenant(_name("missing"), {"max_pending": 3})
    cases: list[tuple[dict[str, Any], str]] = [
        ({"dispatch_rate": 0}, "limits.dispatch_rate"),
        ({"dispatch_rate": "fast"}, "limits.dispatch_rate"),
        ({"max_payload_bytes": 10**7}, "limits.max_payload_bytes"),
        ({"spread": 2}, "limits.spread"),
    ]
    for limits, field in cases:
        with pytest.raises(UnprocessableError) as bad:
            admin.update_tenant(name, limits)
        assert bad.value.field == field, limits
    with pytest.raises(UnprocessableError) as no_limits:
        raise_for(httpx.patch(f"{api_server.url}/v1/tenants/{name}", json={}, headers=_auth(admin)))
    assert no_limits.value.field == "limits"
    key = admin.create_key(name)
    with Client(api_server.url, key["key"]) as tenant, pytest.raises(PermissionDeniedError):
        tenant.update_tenant(name, {"dispatch_rate": 1000})
    assert admin.get_tenant(name)["limits"]["dispatch_rate"] is None


def test_task_lifecycle(acme: TenantClient) -> None:
    task = acme.create_task(delay=60, queue="evals", payload={"n": 1}, retry={"max_attempts": 3})
    assert task["state"] == "scheduled" and task["retry"] == {"max_attempts": 3}
    assert acme.get_task(task["id"])["payload"] == {"n": 1}
    moved = acme.update_task(task["id"], run_at=in_future(120), payload=[1])
    assert moved["payload"] == [1]
    assert acme.update_task(task["id"], delay=5)["payload"] == [1]
    runs = acme.task_runs(task["id"])
    assert [e["event"] for e in runs["events"]][:2] == ["created", "updated"]
    assert acme.cancel_task(task["id"])["state"] == "cancelled"
    with pytest.raises(ConflictError) as again:
        acme.cancel_task(task["id"])
    _err(again, 409, "invalid_state")
    with pytest.raises(ConflictError):
        acme.update_task(task["id"], delay=1)
    with pytest.raises(NotFoundError) as missing:
        acme.get_task("0000000000000000")
    _err(missing, 404, "not_found")
    with pytest.raises(UnprocessableError) as bad:
        acme.create_task(delay=-1)
    assert bad.value.field == "delay"
    with pytest.raises(UnprocessableError) as nothing:
        acme.update_task(acme.create_task(delay=60)["id"])
    assert nothing.value.field == "run_at"
    with pytest.raises(PayloadTooLargeError):
        acme.create_task(delay=1, payload="x" * 70_000)


def test_idempotent_creates(acme: TenantClient) -> None:
    first = acme.create_task(delay=30, payload="x", idempotency_key="daily-1")
    second = acme.create_task(delay=30, payload="y", idempotency_key="daily-1")
    assert second["id"] == first["id"] and second["payload"] == "x"
    results = acme.create_tasks(
        [{"delay": 30, "idempotency_key": "daily-1"}, {"delay": 30}, {"run_at": "soon"}]
    )
    assert [r["status"] for r in results] == [200, 201, 422]
    assert results[0]["task"]["id"] == first["id"]


def test_list_tasks_filters_and_pages(acme: TenantClient) -> None:
    made = {acme.create_task(delay=60, queue="a")["id"] for _ in range(5)}
    other = acme.create_task(delay=60, queue="b")["id"]
    acme.cancel_task(other)
    seen: list[str] = []
    cursor: str | None = None
    for _ in range(100):  # bounded: a page may be short while the cursor goes on
        page = acme.list_tasks(queue="a", limit=2, cursor=cursor)
        assert len(page["items"]) <= 2
        seen.extend(t["id"] for t in page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(made)
    assert [t["id"] for t in acme.iter_tasks(state="cancelled")] == [other]
    assert len(list(acme.iter_tasks())) == 6
    with pytest.raises(UnprocessableError) as bad:
        acme.list_tasks(cursor="zzz")
    assert bad.value.field == "cursor"
    with pytest.raises(UnprocessableError) as bad_state:
        acme.list_tasks(state="done")  # type: ignore[arg-type]
    assert bad_state.value.field == "state"


async def _dead_task(client: TenantClient, engine: Engine, tenant: str) -> str:
    clock = FakeClock.from_wall_clock()  # the API makes tasks due on the real clock
    await prime(engine, clock.now_ms)
    task = client.create_task(delay=0, payload={"k": 1})
    assert await tick_all(engine, clock.advance(1000)) >= 1
    worker = Worker(engine.store, tenant, "default")
    deliveries = await worker.read(count=10, block_ms=100)
    for delivery in deliveries:
        await worker.fail(delivery, "boom", permanent=True)
    assert task["id"] in {d.run_id for d in deliveries}
    return task["id"]


async def test_dead_letters(acme: TenantClient, engine: Engine) -> None:
    run_id = await _dead_task(acme, engine, acme.tenant)
    page = acme.list_dead_letters(limit=10)
    assert [d["run_id"] for d in page["items"]] == [run_id]
    assert page["items"][0]["reason"] == "failed"
    assert acme.replay_dead_letter(run_id)["state"] == "scheduled"
    with pytest.raises(NotFoundError):
        acme.replay_dead_letter(run_id)
    run_id2 = await _dead_task(acme, engine, acme.tenant)
    assert acme.purge_dead_letter(run_id2) == {"run_id": run_id2, "purged": True}
    with pytest.raises(NotFoundError):
        acme.purge_dead_letter(run_id2)
    with pytest.raises(UnprocessableError):
        acme.list_dead_letters(limit=0)


async def test_tenant_isolation_every_verb(
    acme: TenantClient, globex: TenantClient, engine: Engine
) -> None:
    task = acme.create_task(delay=60, queue="q")
    dead = await _dead_task(acme, engine, acme.tenant)
    calls: list[Callable[[], object]] = [
        lambda: globex.get_task(task["id"]),
        lambda: globex.update_task(task["id"], delay=5),
        lambda: globex.cancel_task(task["id"]),
        lambda: globex.task_runs(task["id"]),
        lambda: globex.replay_dead_letter(dead),
        lambda: globex.purge_dead_letter(dead),
        lambda: globex.get_task(dead),
    ]
    for call in calls:
        with pytest.raises(NotFoundError) as exc:
            call()
        _err(exc, 404, "not_found")
    assert list(globex.iter_tasks()) == []
    assert globex.list_dead_letters()["items"] == []
    assert acme.get_task(task["id"])["state"] == "scheduled"  # untouched


def test_roles(api_server: ApiServer, admin: Client, acme: TenantClient) -> None:
    name = _name("x")
    admin_only: list[Callable[[], object]] = [
        lambda: acme.create_tenant(name),
        lambda: acme.get_tenant(acme.tenant),
        lambda: acme.create_key(acme.tenant),
        lambda: acme.revoke_key(acme.tenant, "k1"),
    ]
    for call in admin_only:
        with pytest.raises(PermissionDeniedError) as exc:
            call()
        _err(exc, 403, "forbidden")
    with pytest.raises(PermissionDeniedError):
        admin.list_tasks()
    for key in ("", "tw_not_a_key"):
        with Client(api_server.url, key) as anonymous:
            with pytest.raises(AuthenticationError) as unauthorized:
                anonymous.get_task("0000000000000000")
            _err(unauthorized, 401, "unauthorized")
            with pytest.raises(AuthenticationError):
                anonymous.create_tenant(name)
            assert anonymous.healthz() == {"status": "ok"}


def test_tenant_limits(api_server: ApiServer, admin: Client) -> None:
    with tenant_client(api_server, admin, _name("small"), max_payload_bytes=100) as small:
        small.create_task(delay=60, payload="x" * 50)
        with pytest.raises(PayloadTooLargeError) as big:
            small.create_task(delay=60, payload="x" * 200)
        _err(big, 413, "payload_too_large")
        assert [r["status"] for r in small.create_tasks([{"delay": 1, "payload": "x" * 200}])] == [
            413
        ]
    with tenant_client(api_server, admin, _name("busy"), max_pending=2) as busy:
        busy.create_task(delay=600)
        busy.create_task(delay=600)
        with pytest.raises(RateLimitedError) as over:
            busy.create_task(delay=600)
        _err(over, 429, "over_limit")
        assert over.value.retry_after_s is not None and over.value.retry_after_s >= 1
        with pytest.raises(RateLimitedError):
            busy.create_tasks([{"delay": 600}])
        busy.cancel_task(busy.list_tasks(limit=1)["items"][0]["id"])  # frees a place
        assert busy.create_task(delay=600)["state"] == "scheduled"


def test_operations_endpoints(api_server: ApiServer, acme: TenantClient) -> None:
    acme.create_task(delay=60)
    assert acme.readyz() == {"status": "ready"}
    doc = acme.openapi()
    assert doc["openapi"].startswith("3.")
    assert "/v1/tasks" in doc["paths"] and "get" in doc["paths"]["/v1/tasks"]
    metrics = acme.metrics()
    assert 'timewheel_api_requests_total{method="POST",route="/v1/tasks",status="201"}' in metrics
    assert acme.tenant not in metrics


def test_unreachable_server_is_a_transport_error() -> None:
    with Client(f"http://127.0.0.1:{find_free_port()}", "k", retries=1) as nobody:
        with pytest.raises(TransportError):
            nobody.get_task("0000000000000000")
        with pytest.raises(TransportError):
            nobody.cancel_task("0000000000000000")


async def test_async_client(api_server: ApiServer, admin: Client) -> None:
    name = _name("async")
    admin.create_tenant(name)
    key = admin.create_key(name)["key"]
    async with AsyncClient(api_server.url, key) as tw:
        task = await tw.create_task(delay=60, payload={"a": 1})
        assert (await tw.get_task(task["id"]))["payload"] == {"a": 1}
        assert (await tw.update_task(task["id"], payload=2))["payload"] == 2
        assert [t["id"] async for t in tw.iter_tasks()] == [task["id"]]
        assert len((await tw.list_tasks(limit=1))["items"]) <= 1
        assert (await tw.task_runs(task["id"]))["run_id"] == task["id"]
        [result] = await tw.create_tasks([{"delay": 60}])
        assert result["status"] == 201
        assert (await tw.cancel_task(task["id"]))["state"] == "cancelled"
        assert (await tw.list_dead_letters())["items"] == []
        with pytest.raises(NotFoundError):
            await tw.replay_dead_letter(task["id"])
        with pytest.raises(NotFoundError):
            await tw.purge_dead_letter(task["id"])
        with pytest.raises(PermissionDeniedError):
            await tw.create_tenant(_name("x"))
        with pytest.raises(PermissionDeniedError):
            await tw.get_tenant(name)
        with pytest.raises(PermissionDeniedError):
            await tw.create_key(name)
        with pytest.raises(PermissionDeniedError):
            await tw.revoke_key(name, "k1")
        assert (await tw.healthz())["status"] == "ok"
        assert (await tw.readyz())["status"] == "ready"
        assert "paths" in await tw.openapi()
        assert "timewheel_api_requests_total" in await tw.metrics()
