"""The HTTP API through httpx's ASGI transport on a real redis-server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import redis.asyncio as aioredis
from starlette.routing import Route

from timewheel.api import create_app
from timewheel.config import Settings
from timewheel.engine import Engine
from timewheel.runs.worker import Worker
from timewheel.store.server import find_free_port
from timewheel.store.shard import Store
from timewheel.testing.api import assert_error, tenant_headers
from timewheel.testing.clock import FakeClock
from timewheel.testing.dispatch import prime, tick_all
from timewheel.testing.settings import test_settings


@pytest.fixture
async def client(standalone_engine: Engine) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(standalone_engine.settings, engine=standalone_engine)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    headers = await tenant_headers(standalone_engine, "default")
    async with httpx.AsyncClient(transport=transport, base_url="http://tw", headers=headers) as c:
        yield c


@pytest.fixture
async def admin(standalone_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the admin endpoints (the bootstrap admin key)."""
    engine = await Engine.connect(test_settings(standalone_url, admin_key="tw_admin_test"))
    transport = httpx.ASGITransport(
        app=create_app(engine.settings, engine=engine), raise_app_exceptions=False
    )
    headers = {"Authorization": "Bearer tw_admin_test"}
    try:
        async with httpx.AsyncClient(
            transport=transport, base_url="http://tw", headers=headers
        ) as c:
            yield c
    finally:
        await engine.close()


def in_future(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


def _ms(rfc3339: str) -> int:
    return round(datetime.fromisoformat(rfc3339).timestamp() * 1000)


async def test_create_get_patch_delete(client: httpx.AsyncClient) -> None:
    run_at = in_future(60)
    resp = await client.post(
        "/v1/tasks",
        json={
            "run_at": run_at,
            "payload": {"n": 1},
            "queue": "evals",
            "retry": {"max_attempts": 3},
        },
    )
    assert resp.status_code == 201, resp.text
    task = resp.json()
    assert task["state"] == "scheduled" and task["queue"] == "evals" and task["payload"] == {"n": 1}
    assert task["retry"] == {"max_attempts": 3}
    got = await client.get(f"/v1/tasks/{task['id']}")
    assert got.status_code == 200 and got.json() == task  # the create answer is the record
    new_time = in_future(120)
    patched = await client.patch(
        f"/v1/tasks/{task['id']}", json={"run_at": new_time, "payload": [1, 2]}
    )
    assert patched.status_code == 200, patched.text
    assert patched.json()["payload"] == [1, 2]
    assert _ms(patched.json()["run_at"]) == _ms(new_time)
    deleted = await client.delete(f"/v1/tasks/{task['id']}")
    assert deleted.status_code == 200 and deleted.json()["state"] == "cancelled"
    assert_error(await client.delete(f"/v1/tasks/{task['id']}"), 409, "invalid_state")
    assert_error(
        await client.patch(f"/v1/tasks/{task['id']}", json={"delay": 5}), 409, "invalid_state"
    )


async def test_window_spreads_run_at_and_a_reschedule_sets_the_exact_time(
    client: httpx.AsyncClient,
) -> None:
    run_at = in_future(60)
    tasks = []
    for _ in range(20):
        resp = await client.post("/v1/tasks", json={"run_at": run_at, "window_s": 600})
        assert resp.status_code == 201, resp.text
        tasks.append(resp.json())
    times = [_ms(t["run_at"]) for t in tasks]
    assert all(_ms(run_at) <= t <= _ms(run_at) + 600_000 for t in times)
    assert len(set(times)) > 15
    assert tasks[0]["window_s"] == 600
    exact = in_future(120)
    patched = await client.patch(f"/v1/tasks/{tasks[0]['id']}", json={"run_at": exact})
    assert _ms(patched.json()["run_at"]) == _ms(exact)
    assert_error(
        await client.post("/v1/tasks", json={"delay": 1, "window_s": -5}),
        422,
        "invalid",
        "window_s",
    )


async def test_idempotent_create_answers_200_with_the_existing_task(
    client: httpx.AsyncClient,
) -> None:
    body = {"delay": 30, "payload": "x", "idempotency_key": "sync-2026-11-29"}
    first = await client.post("/v1/tasks", json=body)
    second = await client.post("/v1/tasks", json={**body, "payload": "y"})
    assert (first.status_code, second.status_code) == (201, 200)
    assert second.json()["id"] == first.json()["id"] and second.json()["payload"] == "x"
    by_header = await client.post(
        "/v1/tasks", json={"delay": 30}, headers={"Idempotency-Key": "sync-2026-11-29"}
    )
    assert by_header.status_code == 200 and by_header.json()["id"] == first.json()["id"]


async def test_cancel_after_dispatch_is_409(
    client: httpx.AsyncClient, standalone_engine: Engine
) -> None:
    clock = FakeClock.from_wall_clock()  # the API makes tasks due on the real clock
    await prime(standalone_engine, clock.now_ms)
    created = (await client.post("/v1/tasks", json={"delay": 0})).json()
    assert await tick_all(standalone_engine, clock.advance(1000)) == 1
    assert (await client.get(f"/v1/tasks/{created['id']}")).json()["state"] == "dispatched"
    assert_error(await client.delete(f"/v1/tasks/{created['id']}"), 409, "invalid_state")
    assert_error(
        await client.patch(f"/v1/tasks/{created['id']}", json={"payload": 1}), 409, "invalid_state"
    )


async def test_tenants_do_not_see_each_other(
    client: httpx.AsyncClient, standalone_engine: Engine
) -> None:
    acme = await tenant_headers(standalone_engine, "acme")
    created = (await client.post("/v1/tasks", json={"delay": 60}, headers=acme)).json()
    other = await tenant_headers(standalone_engine, "globex")
    for method in ("GET", "DELETE"):
        resp = await client.request(method, f"/v1/tasks/{created['id']}", headers=other)
        assert_error(resp, 404, "not_found")
    resp = await client.patch(f"/v1/tasks/{created['id']}", json={"delay": 1}, headers=other)
    assert_error(resp, 404, "not_found")
    assert_error(await client.get("/v1/tasks/nonexistent"), 404, "not_found")


@pytest.mark.parametrize(
    ("body", "status", "code", "field"),
    [
        (b"{not json", 400, "malformed_json", None),
        (b"[1, 2]", 400, "malformed_json", None),
        (b"\xff\xfe", 400, "malformed_json", None),
        (json.dumps({"payload": 1}).encode(), 422, "invalid", "run_at"),
        (json.dumps({"run_at": "tomorrow"}).encode(), 422, "invalid", "run_at"),
        (json.dumps({"run_at": "2026-11-29T10:00:00"}).encode(), 422, "invalid", "run_at"),
        (json.dumps({"run_at": "2026-11-29"}).encode(), 422, "invalid", "run_at"),
        (json.dumps({"run_at": 12345}).encode(), 422, "invalid", "run_at"),
        (json.dumps({"run_at": "3026-01-01T00:00:00Z"}).encode(), 422, "invalid", "run_at"),
        (json.dumps({"delay": -1}).encode(), 422, "invalid", "delay"),
        (json.dumps({"delay": "5"}).encode(), 422, "invalid", "delay"),
        (json.dumps({"delay": True}).encode(), 422, "invalid", "delay"),
        (
            json.dumps({"delay": 1, "run_at": "2026-11-29T10:00:00Z"}).encode(),
            422,
            "invalid",
            "delay",
        ),
        (json.dumps({"delay": 1, "queue": "no spaces"}).encode(), 422, "invalid", "queue"),
        (json.dumps({"delay": 1, "priority": 3}).encode(), 422, "invalid", "priority"),
        (
            json.dumps({"delay": 1, "retry": {"max_attempts": 0}}).encode(),
            422,
            "invalid",
            "retry.max_attempts",
        ),
        (
            json.dumps({"delay": 1, "retry": {"jitter": "lots"}}).encode(),
            422,
            "invalid",
            "retry.jitter",
        ),
        (
            json.dumps({"delay": 1, "idempotency_key": ""}).encode(),
            422,
            "invalid",
            "idempotency_key",
        ),
        (
            json.dumps({"delay": 1, "payload": "x" * 70_000}).encode(),
            413,
            "payload_too_large",
            "payload",
        ),
        # Not JSON: the stdlib took NaN and Infinity; they are not JSON and never stored.
        (b'{"delay": NaN}', 400, "malformed_json", None),
        (b'{"delay": 1, "payload": {"x": [1, Infinity]}}', 400, "malformed_json", None),
        (b'{"delay": 1, "payload": -Infinity}', 400, "malformed_json", None),
        (b'{"delay": 1, "retry": {"factor": NaN}}', 400, "malformed_json", None),
        # Numbers past any range are the field's error, never an overflow.
        (b'{"delay": 1' + b"0" * 400 + b"}", 422, "invalid", "delay"),
        (b'{"delay": 1, "window_s": 1' + b"0" * 400 + b"}", 422, "invalid", "window_s"),
        (
            b'{"delay": 1, "visibility_timeout_s": -1' + b"0" * 400 + b"}",
            422,
            "invalid",
            "visibility_timeout_s",
        ),
        (b'{"delay": 1e999}', 422, "invalid", "delay"),
        (
            b'{"delay": 1, "retry": {"max_attempts": 1' + b"0" * 400 + b"}}",
            422,
            "invalid",
            "retry.max_attempts",
        ),
        (b'{"delay": 1, "payload": [1e400]}', 422, "invalid", "payload"),
        (b'{"delay": 1, "payload": ' + b"1" * 5000 + b"}", 422, "invalid", "payload"),
        # Control characters, in any string but the payload.
        (b'{"run_at": "2026-11-29T17:00:00Z\\u0000"}', 422, "invalid", "run_at"),
        (b'{"delay": 1, "queue": "evals\\n"}', 422, "invalid", "queue"),
        (b'{"delay": 1, "queue": "ev\\u007fals"}', 422, "invalid", "queue"),
        (b'{"delay": 1, "idempotency_key": "k\\u0000"}', 422, "invalid", "idempotency_key"),
        (b'{"delay": 1, "idempotency_key": "k\\n"}', 422, "invalid", "idempotency_key"),
        (b'{"delay": 1, "idempotency_key": "k\\u001f1"}', 422, "invalid", "idempotency_key"),
        # expires_at after the time the run is due.
        (
            json.dumps(
                {"run_at": "2030-01-01T00:00:00Z", "expires_at": "2030-01-01T00:00:00Z"}
            ).encode(),
            422,
            "invalid",
            "expires_at",
        ),
        (
            json.dumps(
                {"run_at": "2030-01-02T00:00:00Z", "expires_at": "2030-01-01T00:00:00Z"}
            ).encode(),
            422,
            "invalid",
            "expires_at",
        ),
        (
            json.dumps({"delay": 3600, "expires_at": in_future(60)}).encode(),
            422,
            "invalid",
            "expires_at",
        ),
        (
            json.dumps({"delay": 1, "retry": {"max_attempts": 2.5}}).encode(),
            422,
            "invalid",
            "retry.max_attempts",
        ),
        (json.dumps({"delay": 1, "retry": {"zz": 1}}).encode(), 422, "invalid", "retry.zz"),
        (json.dumps({"delay": 1, "retry": []}).encode(), 422, "invalid", "retry"),
        (json.dumps({"delay": None}).encode(), 422, "invalid", "delay"),
    ],
)
async def test_bad_create_input_gets_a_json_4xx(
    client: httpx.AsyncClient, body: bytes, status: int, code: str, field: str | None
) -> None:
    resp = await client.post(
        "/v1/tasks", content=body, headers={"content-type": "application/json"}
    )
    assert_error(resp, status, code, field)
    assert (await client.get("/v1/tasks")).json()["items"] == []  # nothing was written
    message = resp.json()["error"]["message"]
    for internal in ("Traceback", "Struct", "Unset", "msgspec", "Error", "`"):
        assert internal not in message, message


async def test_a_task_that_expires_after_its_due_time_is_taken(client: httpx.AsyncClient) -> None:
    resp = await client.post("/v1/tasks", json={"delay": 60, "expires_at": in_future(120)})
    assert resp.status_code == 201, resp.text
    made = await client.post(
        "/v1/tasks",
        json={"run_at": "2030-01-01T00:00:00Z", "expires_at": "2030-01-01T00:00:00.001Z"},
    )
    assert made.status_code == 201, made.text
    assert made.json()["expires_at_ms"] == _ms("2030-01-01T00:00:00.001Z")


async def test_big_integers_in_a_payload_are_kept_exactly(client: httpx.AsyncClient) -> None:
    big = 10**400 + 1
    resp = await client.post(
        "/v1/tasks", content=b'{"delay": 60, "payload": {"n": ' + str(big).encode() + b"}}"
    )
    assert resp.status_code == 201, resp.text
    got = await client.get(f"/v1/tasks/{resp.json()['id']}")
    assert got.json()["payload"] == {"n": big}


async def test_oversized_body_is_refused_without_reading_it(client: httpx.AsyncClient) -> None:
    resp = await client.post("/v1/tasks", content=b"[" + b"1," * 200_000 + b"1]")
    assert_error(resp, 413, "payload_too_large", "payload")


async def test_bad_patch_and_key_input(client: httpx.AsyncClient) -> None:
    task = (await client.post("/v1/tasks", json={"delay": 60})).json()
    assert_error(await client.patch(f"/v1/tasks/{task['id']}", json={}), 422, "invalid", "run_at")
    assert_error(
        await client.patch(f"/v1/tasks/{task['id']}", json={"queue": "x"}), 422, "invalid", "queue"
    )
    assert_error(
        await client.patch(f"/v1/tasks/{task['id']}", content=b"nope"), 400, "malformed_json"
    )
    for body, status, code, field in [
        (b'{"payload": NaN}', 400, "malformed_json", None),
        (b'{"payload": {"a": [Infinity]}}', 400, "malformed_json", None),
        (b'{"delay": -Infinity}', 400, "malformed_json", None),
        (b'{"delay": 1' + b"0" * 400 + b"}", 422, "invalid", "delay"),
        (b'{"run_at": "2026-11-29T17:00:00Z\\u0000"}', 422, "invalid", "run_at"),
        (b'{"run_at": "2026-11-29T17:00:00Z", "delay": 1}', 422, "invalid", "delay"),
    ]:
        resp = await client.patch(f"/v1/tasks/{task['id']}", content=body)
        assert_error(resp, status, code, field)
    assert (await client.get(f"/v1/tasks/{task['id']}")).json() == task  # unchanged
    bad_key = await client.post(
        "/v1/tasks", json={"delay": 60}, headers={"Idempotency-Key": "k\tey"}
    )
    assert_error(bad_key, 422, "invalid", "idempotency_key")
    resp = await client.get(f"/v1/tasks/{task['id']}", headers={"Authorization": "Bearer nope"})
    assert_error(resp, 401, "unauthorized")
    assert_error(await client.put(f"/v1/tasks/{task['id']}", json={}), 405, "method_not_allowed")
    assert_error(await client.get("/v2/nothing"), 404, "not_found")


async def test_health_endpoints(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    assert (await client.get("/readyz")).json() == {"status": "ready"}


async def test_batch_create_answers_per_item(client: httpx.AsyncClient) -> None:
    tasks: list[object] = [
        {"delay": 60, "payload": {"n": 1}},
        {"delay": 60, "idempotency_key": "dup"},
        {"delay": 60, "idempotency_key": "dup"},
        {"run_at": "not a time"},
        {"delay": 1, "payload": "x" * 70_000},
        "not an object",
    ]
    resp = await client.post("/v1/tasks/batch", json={"tasks": tasks})
    assert resp.status_code == 200, resp.text
    results = resp.json()["results"]
    assert [r["status"] for r in results] == [201, 201, 200, 422, 413, 422]
    assert results[1]["task"]["id"] == results[2]["task"]["id"]
    assert results[3]["error"]["field"] == "run_at"
    assert results[5]["error"]["field"] == "tasks[5]"
    got = await client.get(f"/v1/tasks/{results[0]['task']['id']}")
    assert got.json()["payload"] == {"n": 1}
    assert_error(await client.post("/v1/tasks/batch", json={"tasks": []}), 422, "invalid", "tasks")
    too_many = {"tasks": [{"delay": 1}] * 1001}
    assert_error(await client.post("/v1/tasks/batch", json=too_many), 422, "invalid", "tasks")


async def test_hostile_batch_items_answer_apart_and_a_nan_refuses_the_whole_body(
    client: httpx.AsyncClient,
) -> None:
    items = [
        b'{"delay": 60}',
        b'{"delay": 1' + b"0" * 400 + b"}",
        b'{"delay": 60, "queue": "q\\u0000"}',
        b'{"run_at": "2026-11-29T17:00:00Z\\u0000"}',
        b'{"delay": 60, "retry": {"max_attempts": 0}}',
        b'{"delay": 60, "payload": [1e400]}',
        b"[]",
    ]
    resp = await client.post("/v1/tasks/batch", content=b'{"tasks": [' + b",".join(items) + b"]}")
    assert resp.status_code == 200, resp.text
    results = resp.json()["results"]
    assert [r["status"] for r in results] == [201, 422, 422, 422, 422, 422, 422]
    fields = [r["error"]["field"] for r in results[1:]]
    assert fields == ["delay", "queue", "run_at", "retry.max_attempts", "payload", "tasks[6]"]
    listed = (await client.get("/v1/tasks")).json()["items"]
    assert [t["id"] for t in listed] == [results[0]["task"]["id"]]  # only the good one
    for poisoned in (
        b'{"tasks": [{"delay": 60}, {"delay": NaN}]}',
        b'{"tasks": [{"delay": 60, "payload": Infinity}]}',
        b'{"tasks": [{"delay": 60}], "extra": -Infinity}',
    ):
        assert_error(await client.post("/v1/tasks/batch", content=poisoned), 400, "malformed_json")
    assert_error(
        await client.post("/v1/tasks/batch", json={"tasks": [{"delay": 1}], "x": 1}),
        422,
        "invalid",
        "x",
    )
    assert len((await client.get("/v1/tasks")).json()["items"]) == 1  # nothing more written


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        (b'{"id": "acme", "limits": {"dispatch_rate": NaN}}', 400, None),
        (
            b'{"id": "acme", "limits": {"max_pending": 1' + b"0" * 400 + b"}}",
            422,
            "limits.max_pending",
        ),
        (b'{"id": "acme", "limits": {"dispatch_rate": 1e400}}', 422, "limits.dispatch_rate"),
        (b'{"id": "acme\\n"}', 422, "id"),
        (b'{"id": "acme", "limits": {"max_payload_bytes": 1.5}}', 422, "limits.max_payload_bytes"),
        (b'{"id": "acme", "limits": {"colour": 1}}', 422, "limits.colour"),
        (b'{"id": 5, "limits": {}}', 422, "id"),
    ],
)
async def test_bad_tenant_bodies_are_refused_before_anything_is_written(
    admin: httpx.AsyncClient, body: bytes, status: int, field: str | None
) -> None:
    resp = await admin.post("/v1/tenants", content=body)
    assert_error(resp, status, "malformed_json" if status == 400 else "invalid", field)
    assert_error(await admin.get("/v1/tenants/acme"), 404, "not_found")
    assert (await admin.post("/v1/tenants", json={"id": "default"})).status_code == 201
    patch = await admin.patch("/v1/tenants/default", content=body)
    assert patch.status_code in (400, 422), patch.text
    limits = (await admin.get("/v1/tenants/default")).json()["limits"]
    assert set(limits.values()) == {None} and "max_pending" in limits  # nothing set


async def test_run_history_and_dead_letters_over_http(
    client: httpx.AsyncClient, standalone_engine: Engine
) -> None:
    clock = FakeClock.from_wall_clock()  # the API makes tasks due on the real clock
    await prime(standalone_engine, clock.now_ms)
    task = (
        await client.post(
            "/v1/tasks", json={"delay": 0, "payload": {"k": "v"}, "retry": {"max_attempts": 1}}
        )
    ).json()
    assert await tick_all(standalone_engine, clock.advance(1000)) == 1
    worker = Worker(standalone_engine.store, "default", "default")
    [delivery] = await worker.read(block_ms=100)
    assert await worker.fail(delivery, "ValueError: nope") == "dead"
    runs = (await client.get(f"/v1/tasks/{task['id']}/runs")).json()
    assert [e["event"] for e in runs["events"]] == ["created", "dispatched", "dead"]
    assert runs["events"][2]["error"] == "ValueError: nope"
    page = (await client.get("/v1/dead-letters?limit=10")).json()
    assert [d["run_id"] for d in page["items"]] == [task["id"]] and page["next_cursor"] is None
    assert page["items"][0]["payload"] == {"k": "v"} and page["items"][0]["reason"] == "failed"
    other = await tenant_headers(standalone_engine, "globex")
    assert (await client.get("/v1/dead-letters", headers=other)).json()["items"] == []
    assert_error(
        await client.post(f"/v1/dead-letters/{task['id']}/replay", headers=other), 404, "not_found"
    )
    assert_error(await client.get(f"/v1/tasks/{task['id']}/runs", headers=other), 404, "not_found")
    replayed = await client.post(f"/v1/dead-letters/{task['id']}/replay")
    assert replayed.status_code == 200 and replayed.json()["state"] == "scheduled"
    assert (await client.get("/v1/dead-letters")).json()["items"] == []
    assert_error(await client.delete(f"/v1/dead-letters/{task['id']}"), 404, "not_found")
    assert_error(await client.get("/v1/dead-letters?limit=0"), 422, "invalid", "limit")
    assert_error(await client.get("/v1/dead-letters?cursor=abc"), 422, "invalid", "cursor")
    # well formed, but past what a stream entry id holds (2^64 - 1 per part)
    too_far = "/v1/dead-letters?cursor=2-68-50564288131875633290"
    assert_error(await client.get(too_far), 422, "invalid", "cursor")
    last = f"/v1/dead-letters?cursor=0-{2**64 - 1}-{2**64 - 1}"
    assert_error(await client.get(last), 422, "invalid", "cursor")
    highest = await client.get(f"/v1/dead-letters?cursor=0-{2**64 - 1}-0")
    assert highest.status_code == 200 and highest.json()["items"] == []


async def test_dead_letter_pages_and_purge(
    client: httpx.AsyncClient, standalone_engine: Engine
) -> None:
    clock = FakeClock.from_wall_clock()  # the API makes tasks due on the real clock
    await prime(standalone_engine, clock.now_ms)
    ids = [(await client.post("/v1/tasks", json={"delay": 0})).json()["id"] for _ in range(5)]
    assert await tick_all(standalone_engine, clock.advance(1000)) == 5
    worker = Worker(standalone_engine.store, "default", "default")
    for delivery in await worker.read(count=10, block_ms=100):
        await worker.fail(delivery, "gone", permanent=True)
    seen: list[str] = []
    cursor = None
    while True:
        url = "/v1/dead-letters?limit=2" + (f"&cursor={cursor}" if cursor else "")
        page = (await client.get(url)).json()
        seen.extend(d["run_id"] for d in page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(ids)
    purged = await client.delete(f"/v1/dead-letters/{ids[0]}")
    assert purged.status_code == 200
    assert_error(await client.get(f"/v1/tasks/{ids[0]}"), 404, "not_found")
    assert len((await client.get("/v1/dead-letters")).json()["items"]) == 4


async def test_a_full_batch_may_exceed_the_single_body_limit(client: httpx.AsyncClient) -> None:
    tasks = [{"delay": 60, "payload": "x" * 300}] * 1000  # about 330 KB
    resp = await client.post("/v1/tasks/batch", json={"tasks": tasks})
    assert resp.status_code == 200, resp.text
    assert {r["status"] for r in resp.json()["results"]} == {201}
    single = await client.post("/v1/tasks", json={"delay": 1, "payload": ["x" * 1000] * 300})
    assert_error(single, 413, "payload_too_large", "payload")


async def test_openapi_describes_exactly_the_routes(
    client: httpx.AsyncClient, standalone_engine: Engine
) -> None:
    doc = (await client.get("/openapi.json")).json()
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    app = create_app(standalone_engine.settings, engine=standalone_engine)
    routed = {
        (m, r.path)
        for r in app.routes
        if isinstance(r, Route)
        for m in (r.methods or ())
        if m != "HEAD"
    }
    assert documented == routed
    create = doc["paths"]["/v1/tasks"]["post"]
    body = create["requestBody"]["content"]["application/json"]["schema"]
    assert body["additionalProperties"] is False
    assert body["properties"]["retry"]["properties"]["jitter"]["enum"] == [
        "full",
        "proportional",
        "none",
    ]
    assert {"201", "200", "400", "401", "403", "413", "422", "429"} <= set(create["responses"])


async def test_concurrent_creates_each_get_their_own_answer(client: httpx.AsyncClient) -> None:
    """Creates arriving together share a pipeline (api/coalescer.py) but answer apart."""
    bodies: list[dict[str, object]] = [{"delay": 60, "payload": i} for i in range(50)]
    bodies += [{"delay": 60, "payload": "same", "idempotency_key": "together"}] * 2
    resps = await asyncio.gather(*(client.post("/v1/tasks", json=b) for b in bodies))
    assert sorted(r.status_code for r in resps) == [200] + [201] * 51
    assert [r.json()["payload"] for r in resps[:50]] == list(range(50))
    assert len({r.json()["id"] for r in resps}) == 51


async def test_redis_down_is_503_not_500() -> None:
    url = f"redis://127.0.0.1:{find_free_port()}"
    settings = Settings(redis_url=url, admin_key="tw_admin")
    engine = Engine(Store(aioredis.Redis.from_url(url, socket_connect_timeout=0.5), settings))
    app = create_app(settings, engine=engine)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://tw") as c:
            assert (await c.get("/readyz")).status_code == 503
            resp = await c.get("/v1/tasks/x", headers={"Authorization": "Bearer tw_some_key"})
            assert_error(resp, 503, "unavailable")
            admin = {"Authorization": "Bearer tw_admin"}
            resp = await c.post("/v1/tenants", json={"id": "acme"}, headers=admin)
            assert_error(resp, 503, "unavailable")
    finally:
        await engine.close()
