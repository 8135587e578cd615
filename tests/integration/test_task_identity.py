"""A task has one JSON rendering and one id spelling through the HTTP API."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from timewheel.api import create_app
from timewheel.engine import Engine
from timewheel.tenants import Limits, TenantStore


@pytest.fixture
async def client(standalone_engine: Engine) -> AsyncIterator[httpx.AsyncClient]:
    engine = standalone_engine
    tenants = TenantStore(engine.client, engine.keys)
    await tenants.create_tenant("acme", Limits())
    _, key = await tenants.issue_key("acme")
    app = create_app(engine.settings, engine=engine)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(transport=transport, base_url="http://tw", headers=headers) as c:
        yield c


async def test_a_task_reads_the_same_from_create_batch_get_and_list(
    client: httpx.AsyncClient,
) -> None:
    body = {"delay": 600, "queue": "q", "payload": {"n": 1}, "retry": {"max_attempts": 2}}
    single = await client.post("/v1/tasks", json=body)
    assert single.status_code == 201, single.text
    batch = await client.post("/v1/tasks/batch", json={"tasks": [body, body]})
    assert batch.status_code == 200, batch.text
    items = batch.json()["results"]
    assert [item["status"] for item in items] == [201, 201]
    made = [single.json()] + [item["task"] for item in items]
    for task in made:
        got = await client.get(f"/v1/tasks/{task['id']}")
        assert got.json() == task
    listed = (await client.get("/v1/tasks", params={"queue": "q"})).json()["items"]
    assert sorted(listed, key=lambda t: t["id"]) == sorted(made, key=lambda t: t["id"])
    # An idempotent repeat in a batch answers 200 with the same rendering.
    again = await client.post(
        "/v1/tasks/batch", json={"tasks": [{**body, "idempotency_key": "k"}] * 2}
    )
    first, second = again.json()["results"]
    assert (first["status"], second["status"]) == (201, 200)
    assert first["task"] == second["task"]


async def test_an_id_alias_is_not_found_and_changes_nothing(client: httpx.AsyncClient) -> None:
    task = (await client.post("/v1/tasks", json={"delay": 600, "payload": 1})).json()
    tid = task["id"]
    for alias in ("+" + tid[1:], " " + tid[1:], tid.upper(), tid + " "):
        assert (await client.get(f"/v1/tasks/{alias}")).status_code == 404
        patched = await client.patch(f"/v1/tasks/{alias}", json={"payload": 2})
        assert patched.status_code == 404
        assert (await client.delete(f"/v1/tasks/{alias}")).status_code == 404
        assert (await client.get(f"/v1/tasks/{alias}/runs")).status_code == 404
        assert (await client.post(f"/v1/dead-letters/{alias}/replay")).status_code == 404
    after = (await client.get(f"/v1/tasks/{tid}")).json()
    assert after == task
    runs = (await client.get(f"/v1/tasks/{tid}/runs")).json()
    assert [e["event"] for e in runs["events"]] == ["created"]
