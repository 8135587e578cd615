"""Request bodies, query strings and responses of the schedule endpoints (see
api/fields.py): the handlers decode with them and /openapi.json documents them."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, Literal, get_args

from msgspec import UNSET, Meta, UnsetType, field

from timewheel.api.common import (
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
    NotBefore,
    NotBoth,
    NotEmpty,
    Query,
    Schema,
    Text,
    Time,
    given,
    ms,
)
from timewheel.api.task_schemas import VisibilityTimeout
from timewheel.schedules.model import NewSchedule, ScheduleChanges
from timewheel.schedules.spec import ScheduleSpec
from timewheel.tasks.window import MAX_SPREAD_S
from timewheel.types import CATCHUPS, OVERLAPS, JSONValue

MAX_WINDOW_S = 366 * 86400
TIMING_FIELDS = ("cron", "timezone", "every_s", "start_at", "end_at")

CatchupName = Literal["skip", "latest", "all"]
OverlapName = Literal["allow", "skip", "buffer_one"]
if (get_args(CatchupName), get_args(OverlapName)) != (CATCHUPS, OVERLAPS):  # pragma: no cover
    raise AssertionError("CatchupName and OverlapName differ from timewheel.types")


Seconds = Annotated[float, Meta(ge=0, le=MAX_WINDOW_S)]


class _ScheduleFields(Body):
    """The fields a schedule's create and its PATCH share."""

    cron: Maybe[
        Annotated[
            Text,
            Meta(min_length=1, max_length=200, description="5 fields, or 6 with seconds first"),
        ]
    ] = UNSET
    timezone: Maybe[
        Annotated[
            Text,
            Meta(
                min_length=1,
                max_length=64,
                description="IANA time zone of the cron fields (default UTC)",
            ),
        ]
    ] = UNSET
    every_s: Maybe[
        Annotated[
            float, Meta(ge=1, le=MAX_WINDOW_S, description="fire every N seconds (instead of cron)")
        ]
    ] = UNSET
    start_at: Maybe[Annotated[Time, Meta(description="no fire before this instant")] | None] = UNSET
    end_at: Maybe[Annotated[Time, Meta(description="no fire after this instant")] | None] = UNSET
    max_runs: Maybe[Annotated[int, Meta(ge=1, le=10**9, description="at most this many runs")]] = (
        UNSET
    )
    queue: Maybe[
        Annotated[
            Name,
            Meta(description="the queue of its runs (default: the deployment's default queue)"),
        ]
    ] = UNSET
    payload: Annotated[Any, Meta(description="the payload of every run; size limited")] = UNSET
    retry: Maybe[RetryPolicy] = UNSET
    visibility_timeout_s: Maybe[VisibilityTimeout] = UNSET
    catchup: Maybe[
        Annotated[
            CatchupName,
            Meta(description="fire times missed by more than misfire_ms (default skip)"),
        ]
    ] = UNSET
    catchup_window_s: Maybe[
        Annotated[Seconds, Meta(description="how far back catchup all goes (default 1 h)")]
    ] = UNSET
    overlap: Maybe[
        Annotated[OverlapName, Meta(description="a fire time while the previous run is in flight")]
    ] = UNSET
    jitter_s: Maybe[
        Annotated[
            float,
            Meta(
                ge=0,
                le=MAX_SPREAD_S,
                description="every run due a fixed offset in [0, jitter_s] after its fire time",
            ),
        ]
    ] = UNSET


class ScheduleCreate(_ScheduleFields):
    """A recurring schedule: cron in a time zone, or every N seconds."""

    rules = (
        NotBoth("cron", "every_s"),
        Either("cron", "every_s", "give cron (with timezone) or every_s"),
    )

    paused: Maybe[
        Annotated[bool, Meta(description="created paused: nothing is planned until resume")]
    ] = UNSET
    idempotency_key: Maybe[
        Annotated[IdempotencyKey, Meta(description="same key, same schedule")]
    ] = UNSET


class SchedulePatch(_ScheduleFields):
    """The fields to change; the others stay."""

    rules = (NotEmpty("nothing to change", field="cron"), NotBoth("cron", "every_s"))

    paused: Maybe[
        Annotated[
            bool, Meta(description="pause (true) or resume (false), as the pause/resume calls")
        ]
    ] = UNSET


class Backfill(Body):
    """The range of fire times to run."""

    rules = (NotBefore("to", "from_"),)

    from_: Annotated[Time, Meta(description="first fire time to include")] = field(name="from")
    to: Annotated[Time, Meta(description="last fire time to include")]


class ScheduleQuery(Query):
    """The page of the schedule list."""

    limit: PageSize = 100
    cursor: Maybe[
        Annotated[Cursor, Meta(pattern=r"^[0-9]{1,4}\.[0-9]{1,20}\.[0-9a-z]{0,20}" + END)]
    ] = UNSET


def _optional_ms(value: datetime | None) -> int | None:
    return None if value is None else ms(value)


def _spec(data: _ScheduleFields, base: ScheduleSpec | None = None) -> ScheduleSpec:
    """A ScheduleSpec from decoded timing fields over `base` (PATCH); InvalidSchedule (422,
    with the field) for a bad cron, an unknown time zone or end_at before start_at."""
    cron = base.cron if base else None
    every_s = base.every_s if base else None
    if isinstance(data.cron, str):
        cron, every_s = data.cron, None
    if isinstance(data.every_s, float):
        every_s, cron = data.every_s, None
    start = base.start_at_ms if base else None
    end = base.end_at_ms if base else None
    return ScheduleSpec(
        cron=cron,
        timezone=data.timezone
        if isinstance(data.timezone, str)
        else (base.timezone if base else "UTC"),
        every_s=every_s,
        start_at_ms=start if data.start_at is UNSET else _optional_ms(data.start_at),
        end_at_ms=end if data.end_at is UNSET else _optional_ms(data.end_at),
        anchor_ms=base.anchor_ms if base else None,
    )


def _run_options(data: _ScheduleFields) -> dict[str, JSONValue]:
    opts: dict[str, JSONValue] = {}
    if isinstance(data.retry, RetryPolicy):
        opts["retry"] = builtins(data.retry)
    for name in ("visibility_timeout_s", "jitter_s"):
        if given(data, name):
            opts[name] = getattr(data, name)
    return opts


def _window_ms(data: _ScheduleFields) -> int | None:
    window = data.catchup_window_s
    return None if isinstance(window, UnsetType) else round(window * 1000)


def new_schedule(
    data: ScheduleCreate, tenant: str, *, default_queue: str, idempotency_header: str | None
) -> NewSchedule:
    """A NewSchedule from a decoded create body."""
    key = data.idempotency_key if isinstance(data.idempotency_key, str) else None
    if key is None and idempotency_header is not None:
        key = convert(idempotency_header, IdempotencyKey, "idempotency_key")
    return NewSchedule(
        tenant=tenant,
        spec=_spec(data),
        queue=data.queue if isinstance(data.queue, str) else default_queue,
        payload_json=payload_json(None if data.payload is UNSET else data.payload),
        options=_run_options(data),
        catchup=data.catchup if isinstance(data.catchup, str) else "skip",
        catchup_window_ms=_window_ms(data) or 3_600_000,
        overlap=data.overlap if isinstance(data.overlap, str) else "allow",
        max_runs=data.max_runs if isinstance(data.max_runs, int) else 0,
        paused=data.paused is True,
        idempotency_key=key,
    )


def timing(data: SchedulePatch) -> Callable[[ScheduleSpec], ScheduleSpec] | None:
    """The new spec of a PATCH as a function of the current one (None: timing unchanged)."""
    if not any(given(data, name) for name in TIMING_FIELDS):
        return None
    return lambda current: _spec(data, current)


def schedule_changes(data: SchedulePatch) -> ScheduleChanges:
    """ScheduleChanges from a decoded PATCH body: the timing fields given apply over the
    current spec, the run options over the current ones (the engine reads both, and
    checks it read the schedule it changes)."""
    return ScheduleChanges(
        spec=timing(data),
        queue=data.queue if isinstance(data.queue, str) else None,
        payload_json=None if data.payload is UNSET else payload_json(data.payload),
        options=_run_options(data) or None,
        catchup=data.catchup if isinstance(data.catchup, str) else None,
        catchup_window_ms=_window_ms(data),
        overlap=data.overlap if isinstance(data.overlap, str) else None,
        max_runs=data.max_runs if isinstance(data.max_runs, int) else None,
    )


SCHEDULE: Schema = {
    "title": "Schedule",
    "type": "object",
    "required": ["id", "queue", "state", "catchup", "overlap", "created_at"],
    "properties": {
        "id": {"type": "string"},
        "queue": {"type": "string"},
        "cron": {"type": "string"},
        "timezone": {"type": "string"},
        "every_s": {"type": "number"},
        "start_at": OPT_TIME,
        "end_at": OPT_TIME,
        "max_runs": {"type": ["integer", "null"]},
        "payload": {},
        "catchup": {"type": "string", "enum": list(CATCHUPS)},
        "catchup_window_s": {"type": "number"},
        "overlap": {"type": "string", "enum": list(OVERLAPS)},
        "state": {"type": "string", "enum": ["active", "paused", "ended"]},
        "paused": {"type": "boolean"},
        "next_run_at": OPT_TIME,
        "last_run_at": OPT_TIME,
        "runs_planned": {"type": "integer"},
        "created_at": TIME,
        "updated_at": TIME,
        "retry": {"type": "object"},
        "visibility_timeout_s": {"type": "number"},
        "jitter_s": {"type": "number"},
        "jitter_offset_ms": {"type": "integer", "description": "this schedule's offset"},
    },
}

SCHEDULE_PAGE_OUT = page_schema("SchedulePage", SCHEDULE)

DELETED: Schema = {
    "title": "ScheduleDeleted",
    "type": "object",
    "required": ["id", "deleted", "runs_dropped"],
    "properties": {
        "id": {"type": "string"},
        "deleted": {"type": "boolean"},
        "runs_dropped": {"type": "integer"},
    },
}

TRIGGERED: Schema = {
    "title": "ScheduleTriggered",
    "type": "object",
    "required": ["run_id", "state"],
    "properties": {"run_id": {"type": "string"}, "state": {"type": "string"}},
}

BACKFILLED: Schema = {
    "title": "ScheduleBackfilled",
    "type": "object",
    "required": ["id", "added", "existing"],
    "properties": {
        "id": {"type": "string"},
        "added": {"type": "integer"},
        "existing": {"type": "integer"},
    },
}

SCHEDULE_RUNS: Schema = {
    "title": "ScheduleRuns",
    "type": "object",
    "required": ["schedule_id", "runs"],
    "properties": {
        "schedule_id": {"type": "string"},
        "runs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["run_id", "state", "events"],
                "properties": {
                    "run_id": {"type": "string"},
                    "state": {"type": "string"},
                    "events": {"type": "array", "items": EVENT},
                },
            },
        },
    },
}
