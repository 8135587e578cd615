"""Admin endpoints: tenants and their API keys (an admin key only)."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse, Response

from timewheel.api.endpoints import Call, Endpoint
from timewheel.api.spec import (
    Integer,
    Nullable,
    Number,
    Obj,
    Schema,
    name_spec,
)
from timewheel.errors import NotFound, ValidationError
from timewheel.tenants import ADMIN, Limits

LIMITS = Obj(
    {
        "max_payload_bytes": Integer(1, 64 * 1024 * 1024, "at most the deployment's limit"),
        "max_pending": Integer(1, 10**12, "most scheduled runs (estimate); over it: 429"),
        "dispatch_rate": Number(0.001, 1e9, "most runs/s dispatched for the tenant; the rest wait"),
    },
    title="TenantLimits",
)

TENANT_CREATE = Obj(
    {"id": name_spec("the tenant id"), "limits": LIMITS},
    required=["id"],
    title="TenantCreate",
)

TENANT_PATCH = Obj(
    {
        "limits": Obj(
            {name: Nullable(spec) for name, spec in LIMITS.fields.items()},
            title="TenantLimitsPatch",
            description="the limits to change; null clears one (no limit, or the default)",
        )
    },
    required=["limits"],
    title="TenantUpdate",
)

TENANT_OUT: Schema = {
    "title": "Tenant",
    "type": "object",
    "required": ["id", "limits"],
    "properties": {
        "id": {"type": "string"},
        "limits": {
            "type": "object",
            "properties": {
                "max_payload_bytes": {"type": ["integer", "null"]},
                "max_pending": {"type": ["integer", "null"]},
                "dispatch_rate": {"type": ["number", "null"]},
            },
        },
        "created_at_ms": {"type": "integer"},
    },
}

KEY_OUT: Schema = {
    "title": "ApiKey",
    "type": "object",
    "required": ["tenant", "key_id", "key"],
    "properties": {
        "tenant": {"type": "string"},
        "key_id": {"type": "string"},
        "key": {"type": "string", "description": "shown once; only its SHA-256 is stored"},
    },
}

REVOKED_OUT: Schema = {
    "type": "object",
    "required": ["key_id", "revoked"],
    "properties": {"key_id": {"type": "string"}, "revoked": {"type": "boolean"}},
}


def _tenant_id(call: Call) -> str:
    tenant_id = call.path["tenant_id"]
    try:
        TENANT_CREATE.fields["id"].parse(tenant_id, "tenant")
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


# fmt: off
TENANT_ENDPOINTS = [
    Endpoint("POST", "/v1/tenants", create_tenant, "createTenant",
             "Register a tenant with its limits (admin)", role=ADMIN, body=TENANT_CREATE,
             status=201, response=TENANT_OUT, errors=(409,)),
    Endpoint("GET", "/v1/tenants/{tenant_id}", get_tenant, "getTenant",
             "A tenant and its limits (admin)", role=ADMIN, response=TENANT_OUT),
    Endpoint("PATCH", "/v1/tenants/{tenant_id}", update_tenant, "updateTenant",
             "Change some of a tenant's limits; null clears one; applies within 1 s (admin)",
             role=ADMIN, body=TENANT_PATCH, response=TENANT_OUT),
    Endpoint("POST", "/v1/tenants/{tenant_id}/keys", issue_key, "createKey",
             "Issue an API key for the tenant; the key is in this answer only (admin)",
             role=ADMIN, status=201, response=KEY_OUT),
    Endpoint("DELETE", "/v1/tenants/{tenant_id}/keys/{key_id}", revoke_key, "revokeKey",
             "Revoke a key; api processes stop taking it within 1 s (admin)", role=ADMIN,
             response=REVOKED_OUT),
]
# fmt: on
