"""GET /v1/audit: the latest complete pass of the continuous auditor
(timewheel/audit/continuous.py), as stored in Redis by the node that ran it.

An admin key sees the whole pass: counts by kind and by tenant, and the stored findings.
A tenant's key sees its own tenant's counts and findings only, never another tenant's,
nor the deployment's own (canaries, shards without an owner).
"""

from __future__ import annotations

import json
from typing import Any

from redis.exceptions import RedisError
from starlette.responses import JSONResponse, Response

from timewheel.api.endpoints import ANY_KEY, Call, Endpoint
from timewheel.api.fields import Schema
from timewheel.errors import NotFound, RedisUnavailable
from timewheel.tenants import ADMIN

FINDING: Schema = {
    "type": "object",
    "required": ["kind", "shard", "tenant", "id", "detail"],
    "properties": {
        "kind": {"type": "string"},
        "shard": {"type": "integer"},
        "tenant": {"type": "string"},
        "id": {"type": "string"},
        "detail": {"type": "string"},
        "reason": {"type": "string"},
    },
}

AUDIT_OUT: Schema = {
    "type": "object",
    "required": ["pass_id", "finished_at", "counts", "findings", "truncated"],
    "properties": {
        "pass_id": {"type": "string"},
        "finished_at": {"type": "string", "format": "date-time"},
        "seconds": {"type": "number"},
        "shards": {"type": "integer"},
        "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
        "tenants": {
            "type": "object",
            "description": "admin only: tenant -> kind -> findings",
            "additionalProperties": {"type": "object"},
        },
        "findings": {"type": "array", "items": FINDING},
        "truncated": {"type": "boolean", "description": "more findings than are listed"},
    },
}


def for_tenant(doc: dict[str, Any], tenant: str) -> dict[str, Any]:
    """The part of a stored pass one tenant may see."""
    counts = doc.get("tenants", {}).get(tenant, {})
    findings = [f for f in doc.get("findings", []) if f.get("tenant") == tenant]
    return {
        "pass_id": doc["pass_id"],
        "finished_at": doc["finished_at"],
        "counts": counts,
        "findings": findings,
        "truncated": sum(counts.values()) > len(findings),
    }


async def get_audit(call: Call) -> Response:
    engine = call.engine
    try:
        raw = await engine.client.get(engine.keys.audit_latest())
    except (RedisError, OSError) as exc:
        raise RedisUnavailable(f"cannot read the latest audit pass: {exc}") from exc
    if raw is None:
        raise NotFound("no continuous audit pass has completed yet")
    doc: dict[str, Any] = json.loads(raw)
    assert call.principal is not None
    if call.principal.role == ADMIN:
        return JSONResponse(doc)
    return JSONResponse(for_tenant(doc, call.tenant_id))


# fmt: off
AUDIT_ENDPOINTS = [
    Endpoint("GET", "/v1/audit", get_audit, "getAudit",
             "The latest continuous audit pass (a tenant's key: its own findings only)",
             role=ANY_KEY, response=AUDIT_OUT, errors=(404,)),
]
# fmt: on
