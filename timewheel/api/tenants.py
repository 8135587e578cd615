"""Admin endpoints: tenants and their API keys (an admin key only)."""

from __future__ import annotations

from typing import Annotated, Any

from msgspec import UNSET, Meta, UnsetType
from starlette.responses import JSONResponse, Response

from timewheel.api.common import builtins
from timewheel.api.decode import convert
from timewheel.api.endpoints import Call, Endpoint
from timewheel.api.fields import Body, Maybe, Name, Schema
from timewheel.errors import NotFound, ValidationError
from timewheel.tenants import ADMIN, Limits

PayloadBytes = Annotated[
    int, Meta(ge=1, le=64 * 1024 * 1024, description="at most the deployment's limit")
]
Pending = Annotated[
    int,
    Meta(
        ge=1,
        le=10**12,
        description="most runs not finished (scheduled, in flight, retrying); over it: 429",
    ),
]
Rate = Annotated[
    float,
    Meta(ge=0.001, le=1e9, description="most runs/s dispatched for the tenant; the rest wait"),
]
TotalBytes = Annotated[
    int,
    Meta(
        ge=1,
        le=10**15,
        description="most payload bytes held (runs not finished, dead letters, schedules); 429",
    ),
]
Schedules = Annotated[int, Meta(ge=1, le=10**9, description="most schedules; over it: 429")]
Queues = Annotated[
    int, Meta(ge=1, le=10**6, description="most queues in use at once; over it: 429")
]
Interval = Annotated[
    float,
    Meta(
        ge=1,
        le=366 * 86400,
        description="shortest time between a schedule's fire times, s; closer: 422",
    ),
]
Backlog = Annotated[
    int,
    Meta(
        ge=0,
        le=10**12,
        description="most undelivered entries per ready stream; past it, runs wait (0: none)",
    ),
]
Shards = Annotated[
    int,
    Meta(
        ge=1,
        le=4096,
        description="shards the tenant's new tasks spread over, at most the deployment's shards",
    ),
]


class TenantLimits(Body):
    """The tenant's limits; a limit left out is the deployment's default (or none)."""

    max_payload_bytes: Maybe[PayloadBytes] = UNSET
    max_pending: Maybe[Pending] = UNSET
    dispatch_rate: Maybe[Rate] = UNSET
    max_payload_total_bytes: Maybe[TotalBytes] = UNSET
    max_schedules: Maybe[Schedules] = UNSET
    max_queues: Maybe[Queues] = UNSET
    min_interval_s: Maybe[Interval] = UNSET
    max_backlog: Maybe[Backlog] = UNSET
    shards: Maybe[Shards] = UNSET


class TenantLimitsPatch(Body):
    """the limits to change; null clears one (the deployment's default)"""

    max_payload_bytes: Maybe[PayloadBytes | None] = UNSET
    max_pending: Maybe[Pending | None] = UNSET
    dispatch_rate: Maybe[Rate | None] = UNSET
    max_payload_total_bytes: Maybe[TotalBytes | None] = UNSET
    max_schedules: Maybe[Schedules | None] = UNSET
    max_queues: Maybe[Queues | None] = UNSET
    min_interval_s: Maybe[Interval | None] = UNSET
    max_backlog: Maybe[Backlog | None] = UNSET
    shards: Maybe[Shards | None] = UNSET


class TenantCreate(Body):
    """A tenant to register."""

    id: Annotated[Name, Meta(description="the tenant id")]
    limits: Maybe[TenantLimits] = UNSET


class TenantUpdate(Body):
    """The limits to change."""

    limits: TenantLimitsPatch


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
                "max_payload_total_bytes": {"type": ["integer", "null"]},
                "max_schedules": {"type": ["integer", "null"]},
                "max_queues": {"type": ["integer", "null"]},
                "min_interval_s": {"type": ["number", "null"]},
                "max_backlog": {"type": ["integer", "null"]},
                "shards": {"type": ["integer", "null"]},
            },
            "description": "the tenant's own limits; null: the deployment's default",
        },
        "created_at_ms": {"type": "integer"},
        "shards": {
            "type": "array",
            "items": {"type": "integer"},
            "description": "the shards the tenant's new tasks and schedules go to",
        },
        "shards_used": {
            "type": "array",
            "items": {"type": "integer"},
            "description": "every shard that may hold the tenant's tasks (read by workers)",
        },
        "parked": {
            "type": "object",
            "additionalProperties": {"type": "integer"},
            "description": "GET only: queue -> runs due but parked in the wheel while the "
            "queue's ready stream is over max_backlog (queues with none left out)",
        },
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
        convert(tenant_id, Name, "tenant")
    except ValidationError:  # not a name a tenant can have: unknown, like any other
        raise NotFound(f"tenant {tenant_id!r} not found") from None
    return tenant_id


def _check_limits(
    call: Call, given: TenantLimits | TenantLimitsPatch | UnsetType
) -> dict[str, Any]:
    """The limits given (None: cleared), the payload limit checked against the deployment's."""
    limits = {} if isinstance(given, UnsetType) else builtins(given)
    max_payload = call.engine.settings.max_payload_bytes
    asked = limits.get("max_payload_bytes")
    if asked is not None and asked > max_payload:
        raise ValidationError(
            f"limits.max_payload_bytes must be at most the deployment's {max_payload}",
            field="limits.max_payload_bytes",
        )
    shards, most = limits.get("shards"), call.engine.settings.shards
    if shards is not None and shards > most:
        raise ValidationError(
            f"limits.shards must be at most the deployment's {most} shards (got {shards})",
            field="limits.shards",
            code="too_many_shards",
        )
    return limits


async def create_tenant(call: Call) -> Response:
    data = call.body(TenantCreate)
    limits = Limits(**_check_limits(call, data.limits))
    tenant = await call.store.create_tenant(data.id, limits)
    return JSONResponse(tenant.to_json(), status_code=201)


async def update_tenant(call: Call) -> Response:
    changes = _check_limits(call, call.body(TenantUpdate).limits)
    tenant = await call.store.update_limits(_tenant_id(call), changes)
    return JSONResponse(tenant.to_json())


async def get_tenant(call: Call) -> Response:
    tenant = await call.store.get_tenant(_tenant_id(call))
    out = tenant.to_json()
    parked = await call.store.parked(tenant)
    if parked is not None:
        out["parked"] = parked
    return JSONResponse(out)


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
             "Register a tenant with its limits (admin)", role=ADMIN, body=TenantCreate,
             status=201, response=TENANT_OUT, errors=(409,)),
    Endpoint("GET", "/v1/tenants/{tenant_id}", get_tenant, "getTenant",
             "A tenant and its limits (admin)", role=ADMIN, response=TENANT_OUT),
    Endpoint("PATCH", "/v1/tenants/{tenant_id}", update_tenant, "updateTenant",
             "Change some of a tenant's limits; null clears one; applies within 1 s (admin)",
             role=ADMIN, body=TenantUpdate, response=TENANT_OUT),
    Endpoint("POST", "/v1/tenants/{tenant_id}/keys", issue_key, "createKey",
             "Issue an API key for the tenant; the key is in this answer only (admin)",
             role=ADMIN, status=201, response=KEY_OUT),
    Endpoint("DELETE", "/v1/tenants/{tenant_id}/keys/{key_id}", revoke_key, "revokeKey",
             "Revoke a key; api processes stop taking it within 1 s (admin)", role=ADMIN,
             response=REVOKED_OUT),
]
# fmt: on
