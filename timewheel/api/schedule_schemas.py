"""Request bodies and responses of the schedule endpoints, as field specs
(timewheel/api/spec.py): the handlers parse with them and /openapi.json documents them."""

from __future__ import annotations

from typing import Any

from timewheel.api.common import (
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
    Bool,
    Integer,
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
from timewheel.errors import ValidationError
from timewheel.schedules.model import NewSchedule, ScheduleChanges
from timewheel.schedules.spec import ScheduleSpec
from timewheel.tasks.window import MAX_SPREAD_S
from timewheel.types import CATCHUPS, OVERLAPS, JSONValue

MAX_WINDOW_S = 366 * 86400
TIMING_FIELDS = ("cron", "timezone", "every_s", "start_at", "end_at")


def _not_both(raw: dict[str, Any], parsed: dict[str, Any]) -> None:
    if "cron" in raw and "every_s" in raw:
        raise ValidationError("give cron or every_s, not both", field="every_s")


def _one_timing(raw: dict[str, Any], parsed: dict[str, Any]) -> None:
    if "cron" not in raw and "every_s" not in raw:
        raise ValidationError("give cron (with timezone) or every_s", field="cron")


def _something(raw: dict[str, Any], parsed: dict[str, Any]) -> None:
    if not raw:
        raise ValidationError("nothing to change", field="cron")


def _in_order(raw: dict[str, Any], parsed: dict[str, Any]) -> None:
    if parsed["to"] < parsed["from"]:
        raise ValidationError("to is before from", field="to")


_FIELDS: dict[str, Any] = {
    "cron": Text(1, 200, description="5 fields, or 6 with seconds first"),
    "timezone": Text(1, 64, description="IANA time zone of the cron fields (default UTC)"),
    "every_s": Number(1, MAX_WINDOW_S, "fire every N seconds (instead of cron)"),
    "start_at": Nullable(Time("no fire before this instant")),
    "end_at": Nullable(Time("no fire after this instant")),
    "max_runs": Integer(1, 10**9, "at most this many runs"),
    "queue": name_spec("the queue of its runs (default: the deployment's default queue)"),
    "payload": AnyJSON("the payload of every run; size limited"),
    "retry": RETRY,
    "visibility_timeout_s": Number(0.1, 86400 * 7, "executor lease without heartbeat"),
    "catchup": OneOf(CATCHUPS, "fire times missed by more than misfire_ms (default skip)"),
    "catchup_window_s": Number(0, MAX_WINDOW_S, "how far back catchup all goes (default 1 h)"),
    "overlap": OneOf(OVERLAPS, "a fire time while the previous run is in flight"),
    "jitter_s": Number(
        0, MAX_SPREAD_S, "every run due a fixed offset in [0, jitter_s] after its fire time"
    ),
}

SCHEDULE_CREATE = Obj(
    {
        **_FIELDS,
        "paused": Bool("created paused: nothing is planned until resume"),
        "idempotency_key": Text(1, 255, description="same key, same schedule"),
    },
    checks=[_not_both, _one_timing],
    extra_schema={
        "anyOf": [{"required": ["cron"]}, {"required": ["every_s"]}],
        "not": {"required": ["cron", "every_s"]},
    },
    title="ScheduleCreate",
)

SCHEDULE_PATCH = Obj(
    {**_FIELDS, "paused": Bool("pause (true) or resume (false), as the pause/resume calls")},
    checks=[_something, _not_both],
    extra_schema={"minProperties": 1, "not": {"required": ["cron", "every_s"]}},
    title="SchedulePatch",
)

BACKFILL = Obj(
    {"from": Time("first fire time to include"), "to": Time("last fire time to include")},
    required=["from", "to"],
    checks=[_in_order],
    title="Backfill",
)


def _spec(data: dict[str, Any], base: ScheduleSpec | None = None) -> ScheduleSpec:
    """A ScheduleSpec from parsed timing fields over `base` (PATCH); InvalidSchedule (422,
    with the field) for a bad cron, an unknown time zone or end_at before start_at."""
    cron = base.cron if base else None
    every_s = base.every_s if base else None
    if "cron" in data:
        cron, every_s = data["cron"], None
    if "every_s" in data:
        every_s, cron = data["every_s"], None
    start = base.start_at_ms if base else None
    end = base.end_at_ms if base else None
    return ScheduleSpec(
        cron=cron,
        timezone=data.get("timezone", base.timezone if base else "UTC"),
        every_s=every_s,
        start_at_ms=data.get("start_at", start),
        end_at_ms=data.get("end_at", end),
        anchor_ms=base.anchor_ms if base else None,
    )


def _run_options(data: dict[str, Any]) -> dict[str, JSONValue]:
    return {k: data[k] for k in ("retry", "visibility_timeout_s", "jitter_s") if k in data}


def _window_ms(data: dict[str, Any]) -> int | None:
    return round(data["catchup_window_s"] * 1000) if "catchup_window_s" in data else None


def new_schedule(
    data: dict[str, Any], tenant: str, *, default_queue: str, idempotency_header: str | None
) -> NewSchedule:
    """A NewSchedule from a create body parsed by SCHEDULE_CREATE."""
    key = data.get("idempotency_key")
    if key is None and idempotency_header is not None:
        key = SCHEDULE_CREATE.fields["idempotency_key"].parse(idempotency_header, "idempotency_key")
    return NewSchedule(
        tenant=tenant,
        spec=_spec(data),
        queue=data.get("queue", default_queue),
        payload_json=payload_json(data.get("payload")),
        options=_run_options(data),
        catchup=data.get("catchup", "skip"),
        catchup_window_ms=_window_ms(data) or 3_600_000,
        overlap=data.get("overlap", "allow"),
        max_runs=data.get("max_runs") or 0,
        paused=data.get("paused", False),
        idempotency_key=key,
    )


def schedule_changes(data: dict[str, Any]) -> ScheduleChanges:
    """ScheduleChanges from a PATCH body parsed by SCHEDULE_PATCH: the timing fields given
    apply over the current spec, the run options over the current ones (the engine reads
    both, and checks it read the schedule it changes)."""
    timing = set(TIMING_FIELDS) & data.keys()
    return ScheduleChanges(
        spec=(lambda current: _spec(data, current)) if timing else None,
        queue=data.get("queue"),
        payload_json=payload_json(data["payload"]) if "payload" in data else None,
        options=_run_options(data) or None,
        catchup=data.get("catchup"),
        catchup_window_ms=_window_ms(data),
        overlap=data.get("overlap"),
        max_runs=data.get("max_runs"),
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

SCHEDULE_PAGE = Query(
    {
        "limit": PAGE_SIZE,
        "cursor": Param(
            Text(1, 64, r"\d{1,4}\.\d{1,20}\.[0-9a-z]{0,20}", "cursor is not one this API gave out")
        ),
    }
)

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
