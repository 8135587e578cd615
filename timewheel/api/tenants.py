"""Admin endpoints: tenants and their API keys (an admin key only)."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse, Response

from timewheel.api import common as schemas
from timewheel.api.endpoints import Call, Endpoint
from timewheel.errors import NotFound, ValidationError
from timewheel.tenants import ADMIN, Limits


def _tenant_id(call: Call) -> str:
    tenant_id = call.path["tenant_id"]
    try:
        schemas.TENANT_CREATE.fields["id"].parse(tenant_id, "tenant")
    except ValidationError:  # not a name a tenant can have: unknown, like any other
        raise NotFound(f"tenant {tenant_id!r} not found") from None
    return tenant_id


def _check_limits(call: Call, limits: dict[str, Any]) -> dict[str, Any]:
    max_payload = call.engine.settings.max_payload_bytes
    asked = limits.get("max_payload_bytes")
    if asked is not None and asked > max_payload:
        raise ValidationError(
            f"limits.max_payload_bytes must be at most the deployment's {max_payload}",
            field="limits.max_payload_bytes",
        )
    return limits


async def create_tenant(call: Call) -> Response:
    limits = Limits(**_check_limits(call, call.data.get("limits", {})))
    tenant = await call.store.create_tenant(call.data["id"], limits)
    return JSONResponse(tenant.to_json(), status_code=201)


async def update_tenant(call: Call) -> Response:
    changes = _check_limits(call, call.data["limits"])
    tenant = await call.store.update_limits(_tenant_id(call), changes)
    return JSONResponse(tenant.to_json())


async def get_tenant(call: Call) -> Response:
    tenant = await call.store.get_tenant(_tenant_id(call))
    return JSONResponse(tenant.to_json())


async def issue_key(call: Call) -> Response:
    tenant_id = _tenant_id(call)
    key_id, key = await call.store.issue_key(tenant_id)
    return JSONResponse({"tenant": tenant_id, "key_id": key_id, "key": key}, status_code=201)


async def revoke_key(call: Call) -> Response:
    key_id = call.path["key_id"]
    await call.store.revoke_key(_tenant_id(call), key_id)
    return JSONResponse({"key_id": key_id, "revoked": True})


S = schemas

# fmt: off
TENANT_ENDPOINTS = [
    Endpoint("POST", "/v1/tenants", create_tenant, "createTenant",
             "Register a tenant with its limits (admin)", role=ADMIN, body=S.TENANT_CREATE,
             status=201, response=S.TENANT_OUT, errors=(409,)),
    Endpoint("GET", "/v1/tenants/{tenant_id}", get_tenant, "getTenant",
             "A tenant and its limits (admin)", role=ADMIN, response=S.TENANT_OUT),
    Endpoint("PATCH", "/v1/tenants/{tenant_id}", update_tenant, "updateTenant",
             "Change some of a tenant's limits; null clears one; applies within 1 s (admin)",
             role=ADMIN, body=S.TENANT_PATCH, response=S.TENANT_OUT),
    Endpoint("POST", "/v1/tenants/{tenant_id}/keys", issue_key, "createKey",
             "Issue an API key for the tenant; the key is in this answer only (admin)",
             role=ADMIN, status=201, response=S.KEY_OUT),
    Endpoint("DELETE", "/v1/tenants/{tenant_id}/keys/{key_id}", revoke_key, "revokeKey",
             "Revoke a key; api processes stop taking it within 1 s (admin)", role=ADMIN,
             response=S.REVOKED_OUT),
]
# fmt: on
