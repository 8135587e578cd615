"""Task bodies, query strings and responses of the HTTP API (see api/fields.py)."""

from __future__ import annotations

import time
from typing import Annotated, Any

import msgspec
from msgspec import UNSET, Meta, UnsetType

from timewheel.api.common import (
    ERROR,
    EVENT,
    OPT_TIME,
    TIME,
    Cursor,
    PageSize,
    RetryPolicy,
    builtins,
    page_schema,
    payload_json,
)
from timewheel.api.decode import convert
from timewheel.api.fields import (
    END,
    Body,
    Either,
    IdempotencyKey,
    Maybe,
    Name,
    NotBoth,
    NotEmpty,
    Query,
    Schema,
    Time,
    ms,
)
from timewheel.errors import ValidationError
from timewheel.tasks.model import NewTask
from timewheel.tasks.window import MAX_SPREAD_S
from timewheel.types import STATES, JSONValue, StateName

MAX_DELAY_S = 10 * 365 * 86400
MAX_BATCH = 1000

Delay = Annotated[float, Meta(ge=0, le=MAX_DELAY_S)]
VisibilityTimeout = Annotated[
    float, Meta(ge=0.1, le=86400 * 7, description="executor lease without heartbeat")
]


class ExpiresAfterDue:
    """expires_at, when given, is after the time the run is due (run_at, or now + delay)."""

    def check(self, body: Body) -> None:
        assert isinstance(body, TaskCreate)
        if isinstance(body.expires_at, UnsetType):
            return
        if not isinstance(body.run_at, UnsetType):
            due_ms = float(ms(body.run_at))
        else:
            delay = 0.0 if isinstance(body.delay, UnsetType) else body.delay
            due_ms = (time.time() + delay) * 1000
        if ms(body.expires_at) <= due_ms:
            raise ValidationError(
                "expires_at must be after the run is due (run_at, or now + delay)",
                field="expires_at",
            )

    def schema(self) -> Schema:
        return {}


class TaskCreate(Body):
    """A one-shot task: when it is due, where it goes, what it carries."""

    rules = (
        Either("run_at", "delay", "run_at (RFC 3339) or delay (seconds) is required"),
        NotBoth("run_at", "delay"),
        ExpiresAfterDue(),
    )

    run_at: Maybe[
        Annotated[Time, Meta(description="when the run is due (RFC 3339 with an offset)")]
    ] = UNSET
    delay: Maybe[Annotated[Delay, Meta(description="seconds from now")]] = UNSET
    idempotency_key: Maybe[
        Annotated[IdempotencyKey, Meta(description="same key, same task (or Idempotency-Key)")]
    ] = UNSET
    queue: Maybe[
        Annotated[Name, Meta(description="the queue (default: the deployment's default queue)")]
    ] = UNSET
    payload: Annotated[Any, Meta(description="any JSON; size limited")] = UNSET
    retry: Maybe[RetryPolicy] = UNSET
    visibility_timeout_s: Maybe[VisibilityTimeout] = UNSET
    expires_at: Maybe[
        Annotated[
            Time,
            Meta(
                description="dead-letter (reason expired) if not dispatched by then; after the"
                " time the run is due"
            ),
        ]
    ] = UNSET
    window_s: Maybe[
        Annotated[
            float,
            Meta(
                ge=0,
                le=MAX_SPREAD_S,
                description="spread: the run is due at a time in [run_at, run_at + window_s]",
            ),
        ]
    ] = UNSET


class TaskPatch(Body):
    """A new due time and/or payload for a task still scheduled."""

    rules = (
        NotEmpty("nothing to change: give run_at, delay or payload", field="run_at"),
        NotBoth("run_at", "delay"),
    )

    run_at: Maybe[Annotated[Time, Meta(description="new due time")]] = UNSET
    delay: Maybe[Annotated[Delay, Meta(description="new due time, seconds from now")]] = UNSET
    payload: Annotated[Any, Meta(description="new payload")] = UNSET


TaskItem = Annotated[
    msgspec.Raw, Meta(extra_json_schema={"$ref": "#/components/schemas/TaskCreate"})
]
"""A task of a batch, a TaskCreate: decoded on its own (api/tasks.py), so that each item
answers apart."""


class TaskBatch(Body):
    """Up to 1,000 tasks, each created (or refused) on its own."""

    tasks: Annotated[
        list[TaskItem],
        Meta(
            min_length=1,
            max_length=MAX_BATCH,
            extra={"message": f"tasks must be a list of 1..{MAX_BATCH} task objects"},
        ),
    ]


class TaskQuery(Query):
    """The filters and the page of the task list."""

    queue: Maybe[Annotated[Name, Meta(description="only this queue")]] = UNSET
    state: Maybe[Annotated[StateName, Meta(description="only this state")]] = UNSET
    limit: PageSize = 100
    cursor: Maybe[
        Annotated[
            Cursor, Meta(pattern=r"^[0-9]{1,4}\.[0-9]{1,7}\.[0-9]{1,20}\.[0-9a-z@]{0,40}" + END)
        ]
    ] = UNSET


def _options(body: TaskCreate) -> dict[str, JSONValue]:
    opts: dict[str, JSONValue] = {}
    if not isinstance(body.retry, UnsetType):
        opts["retry"] = builtins(body.retry)
    if not isinstance(body.visibility_timeout_s, UnsetType):
        opts["visibility_timeout_s"] = body.visibility_timeout_s
    if not isinstance(body.window_s, UnsetType):
        opts["window_s"] = body.window_s
    if not isinstance(body.expires_at, UnsetType):
        opts["expires_at_ms"] = ms(body.expires_at)
    return opts


def idempotency_key(body: TaskCreate, header: str | None) -> str | None:
    """The body's idempotency key, else the Idempotency-Key header's (checked as the field)."""
    if not isinstance(body.idempotency_key, UnsetType):
        return body.idempotency_key
    if header is None:
        return None
    key: str = convert(header, IdempotencyKey, "idempotency_key")
    return key


def new_task(
    body: TaskCreate, tenant: str, *, default_queue: str, idempotency_header: str | None
) -> NewTask:
    """A NewTask from a decoded create body."""
    return NewTask(
        tenant=tenant,
        queue=default_queue if isinstance(body.queue, UnsetType) else body.queue,
        payload_json=payload_json(None if body.payload is UNSET else body.payload),
        run_at_ms=None if isinstance(body.run_at, UnsetType) else ms(body.run_at),
        delay_ms=None if isinstance(body.delay, UnsetType) else round(body.delay * 1000),
        idempotency_key=idempotency_key(body, idempotency_header),
        options=_options(body),
    )


def patch_values(body: TaskPatch) -> tuple[int | None, int | None, str | None]:
    """A decoded PATCH body: (run_at_ms, delay_ms, payload_json), None = unchanged."""
    run_at = None if isinstance(body.run_at, UnsetType) else ms(body.run_at)
    delay = None if isinstance(body.delay, UnsetType) else round(body.delay * 1000)
    payload = None if body.payload is UNSET else payload_json(body.payload)
    return run_at, delay, payload


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
