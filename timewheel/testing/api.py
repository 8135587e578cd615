"""The HTTP API in tests: a tenant's auth headers, and the shape every error answer has."""

from __future__ import annotations

import httpx

from timewheel.engine import Engine
from timewheel.tenants import Limits, TenantStore


async def tenant_headers(engine: Engine, tenant: str) -> dict[str, str]:
    """Register `tenant` (if new) and return headers with a fresh key of it."""
    store = TenantStore(engine.client, engine.keys, placements=engine.store.placements)
    if not await engine.client.hexists(engine.keys.tenants(), tenant):
        await store.create_tenant(tenant, Limits())
    _, key = await store.issue_key(tenant)
    return {"Authorization": f"Bearer {key}"}


def assert_error(resp: httpx.Response, status: int, code: str, field: str | None = None) -> None:
    """The answer is the API's error body: {"error": {code, message[, field]}}."""
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    if field is not None:
        assert body["error"]["field"] == field
