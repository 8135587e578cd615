"""Request bodies and query strings of the HTTP API, as field specs (timewheel/api/spec.py).

The handlers parse with these objects and the OpenAPI document is generated from the
same objects. Response shapes are JSON Schema here too (they are produced, not parsed).
"""

from __future__ import annotations

import json
from typing import Any

from timewheel.api.spec import (
    AnyJSON,
    Array,
    Integer,
    IntText,
    Nullable,
    Number,
    Obj,
    OneOf,
    Param,
    Query,
    Schema,
    Text,
    Time,
    name_spec,
)
from timewheel.engine import NewTask
from timewheel.errors import ValidationError
from timewheel.models import JSONValue
from timewheel.tasks.window import MAX_SPREAD_S
from timewheel.types import STATES

MAX_DELAY_S = 10 * 365 * 86400
MAX_BATCH = 1000
JITTERS = ("full", "proportional", "none")


def parse_json_object(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a ValidationError with code malformed_json."""
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ValidationError(f"body is not valid JSON: {exc}", code="malformed_json") from None
    if not isinstance(value, dict):
        raise ValidationError("body must be a JSON object", code="malformed_json")
    return value


def _one_time(required: bool) -> Any:
    def check(raw: dict[str, Any], parsed: dict[str, Any]) -> None:
        if "run_at" in raw and "delay" in raw:
            raise ValidationError("give run_at or delay, not both", field="delay")
        if required and "run_at" not in raw and "delay" not in raw:
            raise ValidationError(
                "run_at (RFC 3339) or delay (seconds) is required", field="run_at"
            )

    return check


def _something(raw: dict[str, Any], parsed: dict[str, Any]) -> None:
    if not raw:
        raise ValidationError("nothing to change: give run_at, delay or payload", field="run_at")


RETRY = Obj(
    {
        "max_attempts": Integer(1, 1000, "attempts before the run is dead-lettered"),
        "initial_s": Number(0.001, 86400.0, "backoff before the second attempt"),
        "factor": Number(1.0, 100.0, "backoff multiplier per attempt"),
        "max_s": Number(0.001, 30 * 86400.0, "cap of one backoff"),
        "jitter": OneOf(JITTERS),
    },
    title="RetryPolicy",
    description="retry policy; missing fields take the deployment's defaults",
)

CREATE = Obj(
    {
        "run_at": Time("when the run is due (RFC 3339 with an offset)"),
        "delay": Number(0, MAX_DELAY_S, "seconds from now"),
        "idempotency_key": Text(1, 255, description="same key, same task (or Idempotency-Key)"),
        "queue": name_spec("the queue (default: the deployment's default queue)"),
        "payload": AnyJSON("any JSON; size limited"),
        "retry": RETRY,
        "visibility_timeout_s": Number(0.1, 86400 * 7, "executor lease without heartbeat"),
        "expires_at": Time("dead-letter (reason expired) if not dispatched by then"),
        "window_s": Number(
            0, MAX_SPREAD_S, "spread: the run is due at a time in [run_at, run_at + window_s]"
        ),
    },
    checks=[_one_time(required=True)],
    extra_schema={
        "anyOf": [{"required": ["run_at"]}, {"required": ["delay"]}],
        "not": {"required": ["run_at", "delay"]},
    },
    message="each task must be a JSON object",
    title="TaskCreate",
)

PATCH = Obj(
    {
        "run_at": Time("new due time"),
        "delay": Number(0, MAX_DELAY_S, "new due time, seconds from now"),
        "payload": AnyJSON("new payload"),
    },
    checks=[_something, _one_time(required=False)],
    extra_schema={"minProperties": 1, "not": {"required": ["run_at", "delay"]}},
    title="TaskPatch",
)

BATCH = Obj(
    {"tasks": Array(CREATE, 1, MAX_BATCH, f"tasks must be a list of 1..{MAX_BATCH} task objects")},
    required=["tasks"],
    title="TaskBatch",
)

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

_LIMIT = Param(IntText(1, 1000, "page size (default 100)"), "100")

DEAD_PAGE = Query(
    {
        "limit": _LIMIT,
        "cursor": Param(
            Text(1, 64, r"\d{1,4}-\d{1,20}-\d{1,20}", "cursor is not one this API gave out")
        ),
    }
)

TASK_PAGE = Query(
    {
        "queue": Param(name_spec("only this queue")),
        "state": Param(OneOf(STATES, "only this state")),
        "limit": _LIMIT,
        "cursor": Param(
            Text(
                1,
                64,
                r"\d{1,4}\.\d{1,4}\.\d{1,20}\.[0-9a-z@]{0,40}",
                "cursor is not one this API gave out",
            )
        ),
    }
)


def payload_json(value: JSONValue) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _options(parsed: dict[str, Any]) -> dict[str, JSONValue]:
    opts: dict[str, JSONValue] = {}
    for name in ("retry", "visibility_timeout_s", "window_s"):
        if name in parsed:
            opts[name] = parsed[name]
    if "expires_at" in parsed:
        opts["expires_at_ms"] = parsed["expires_at"]
    return opts


def parse_create(
    body: object, tenant: str, *, default_queue: str, idempotency_header: str | None
) -> NewTask:
    """A create request body (DESIGN.md section 11) as a NewTask."""
    return new_task(
        CREATE.parse(body),
        tenant,
        default_queue=default_queue,
        idempotency_header=idempotency_header,
    )


def new_task(
    parsed: dict[str, Any], tenant: str, *, default_queue: str, idempotency_header: str | None
) -> NewTask:
    """A NewTask from a create body already parsed by CREATE."""
    key = parsed.get("idempotency_key")
    if key is None and idempotency_header is not None:
        key = CREATE.fields["idempotency_key"].parse(idempotency_header, "idempotency_key")
    return NewTask(
        tenant=tenant,
        queue=parsed.get("queue", default_queue),
        payload_json=payload_json(parsed.get("payload")),
        run_at_ms=parsed.get("run_at"),
        delay_ms=round(parsed["delay"] * 1000) if "delay" in parsed else None,
        idempotency_key=key,
        options=_options(parsed),
    )


def patch_values(parsed: dict[str, Any]) -> tuple[int | None, int | None, str | None]:
    """A PATCH body parsed by PATCH: (run_at_ms, delay_ms, payload_json), None = unchanged."""
    delay = parsed.get("delay")
    payload = payload_json(parsed["payload"]) if "payload" in parsed else None
    return parsed.get("run_at"), None if delay is None else round(delay * 1000), payload


# -- responses (documentation only: the handlers build them) --------------------------

ERROR: Schema = {
    "title": "Error",
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message", "field"],
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "field": {"type": ["string", "null"]},
            },
        }
    },
}

TIME: Schema = {"type": "string", "format": "date-time"}
OPT_TIME: Schema = {"type": ["string", "null"], "format": "date-time"}

EVENT: Schema = {
    "type": "object",
    "properties": {
        "event": {"type": "string"},
        "at": TIME,
        "attempt": {"type": ["integer", "null"]},
        "reason": {"type": ["string", "null"]},
        "error": {"type": ["string", "null"]},
    },
}
"""One event of a run's history (routes.event_json)."""

TASK: Schema = {
    "title": "Task",
    "type": "object",
    "required": ["id", "run_id", "queue", "state", "attempt", "run_at"],
    "properties": {
        "id": {"type": "string"},
        "run_id": {"type": "string"},
        "queue": {"type": "string"},
        "state": {"type": "string", "enum": list(STATES)},
        "attempt": {"type": "integer"},
        "run_at": TIME,
        "created_at": TIME,
        "updated_at": OPT_TIME,
        "payload": {},
        "last_error": {"type": ["string", "null"]},
        "schedule_id": {"type": "string"},
        "retry": {"type": "object"},
        "visibility_timeout_s": {"type": "number"},
        "expires_at_ms": {"type": "integer"},
        "window_s": {"type": "number"},
    },
}


def page_schema(title: str, item: Schema) -> Schema:
    """A page of a listing: its items and the cursor of the next page (null: the end)."""
    return {
        "title": title,
        "type": "object",
        "required": ["items", "next_cursor"],
        "properties": {
            "items": {"type": "array", "items": item},
            "next_cursor": {"type": ["string", "null"]},
        },
    }


TASK_PAGE_OUT = page_schema("TaskPage", TASK)

BATCH_OUT: Schema = {
    "title": "BatchResult",
    "type": "object",
    "required": ["results"],
    "properties": {
        "results": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["status"],
                "properties": {
                    "status": {"type": "integer"},
                    "task": {"type": "object"},
                    "error": ERROR["properties"]["error"],
                },
            },
        }
    },
}

RUNS_OUT: Schema = {
    "title": "RunHistory",
    "type": "object",
    "required": ["run_id", "events"],
    "properties": {
        "run_id": {"type": "string"},
        "events": {"type": "array", "items": EVENT},
    },
}

DEAD_PAGE_OUT = page_schema(
    "DeadLetterPage",
    {
        "type": "object",
        "properties": {
            "run_id": {"type": "string"},
            "queue": {"type": "string"},
            "attempt": {"type": "integer"},
            "reason": {"type": "string"},
            "error": {"type": "string"},
            "dead_at": TIME,
            "run_at": TIME,
            "payload": {},
        },
    },
)

REPLAY_OUT: Schema = {
    "type": "object",
    "required": ["run_id", "state", "run_at"],
    "properties": {"run_id": {"type": "string"}, "state": {"type": "string"}, "run_at": TIME},
}

PURGE_OUT: Schema = {
    "type": "object",
    "required": ["run_id", "purged"],
    "properties": {"run_id": {"type": "string"}, "purged": {"type": "boolean"}},
}

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

STATUS_OUT: Schema = {"type": "object", "properties": {"status": {"type": "string"}}}
