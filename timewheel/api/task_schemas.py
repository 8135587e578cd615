"""Task bodies, query strings and responses of the HTTP API (see api/common.py)."""

from __future__ import annotations

from typing import Any

from timewheel.api.common import (
    ERROR,
    EVENT,
    OPT_TIME,
    PAGE_SIZE,
    RETRY,
    TIME,
    page_schema,
    payload_json,
)
from timewheel.api.spec import (
    AnyJSON,
    Array,
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
from timewheel.errors import ValidationError
from timewheel.tasks.model import NewTask
from timewheel.tasks.window import MAX_SPREAD_S
from timewheel.types import STATES, JSONValue

MAX_DELAY_S = 10 * 365 * 86400
MAX_BATCH = 1000


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


TASK_PAGE = Query(
    {
        "queue": Param(name_spec("only this queue")),
        "state": Param(OneOf(STATES, "only this state")),
        "limit": PAGE_SIZE,
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
    """A create request body as a NewTask."""
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
