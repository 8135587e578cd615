"""Request bodies of the schedule endpoints, parsed into engine values or ValidationError."""

from __future__ import annotations

from typing import Any

from timewheel.api.schemas import _number, _payload_json, _retry, _unknown, parse_time_ms
from timewheel.engine import validate_name
from timewheel.errors import ValidationError
from timewheel.models import JSONValue
from timewheel.schedule import ScheduleSpec
from timewheel.schedules import CATCHUPS, OVERLAPS, NewSchedule, ScheduleChanges

TIMING_FIELDS = {"cron", "timezone", "every_s", "start_at", "end_at"}
POLICY_FIELDS = {
    "queue",
    "payload",
    "max_runs",
    "retry",
    "visibility_timeout_s",
    "catchup",
    "catchup_window_s",
    "overlap",
}
CREATE_FIELDS = TIMING_FIELDS | POLICY_FIELDS | {"paused", "idempotency_key"}
PATCH_FIELDS = TIMING_FIELDS | POLICY_FIELDS
MAX_WINDOW_S = 366 * 86400


def _string(value: object, field: str, *, high: int = 255) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= high:
        raise ValidationError(f"{field} must be a string of 1-{high} characters", field=field)
    return value


def _choice(value: object, field: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValidationError(f"{field} must be one of {', '.join(allowed)}", field=field)
    assert isinstance(value, str)
    return value


def _max_runs(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10**9:
        raise ValidationError("max_runs must be an integer >= 1, or null", field="max_runs")
    return value


def _spec(body: dict[str, Any], base: ScheduleSpec | None = None) -> ScheduleSpec:
    """A ScheduleSpec from the timing fields of `body`, over `base` (PATCH)."""
    cron = base.cron if base else None
    every_s = base.every_s if base else None
    if "cron" in body:
        cron, every_s = _string(body["cron"], "cron", high=200), None
    if "every_s" in body:
        if "cron" in body:
            raise ValidationError("give cron or every_s, not both", field="every_s")
        every_s, cron = _number(body["every_s"], "every_s", low=1, high=MAX_WINDOW_S), None
    timezone = base.timezone if base else "UTC"
    if "timezone" in body:
        timezone = _string(body["timezone"], "timezone", high=64)
    start = base.start_at_ms if base else None
    end = base.end_at_ms if base else None
    if "start_at" in body:
        start = None if body["start_at"] is None else parse_time_ms(body["start_at"], "start_at")
    if "end_at" in body:
        end = None if body["end_at"] is None else parse_time_ms(body["end_at"], "end_at")
    if cron is None and every_s is None:
        raise ValidationError("give cron (with timezone) or every_s", field="cron")
    return ScheduleSpec(
        cron=cron,
        timezone=timezone,
        every_s=every_s,
        start_at_ms=start,
        end_at_ms=end,
        anchor_ms=base.anchor_ms if base else None,
    )


def _run_options(body: dict[str, Any]) -> dict[str, JSONValue]:
    opts: dict[str, JSONValue] = {}
    if "retry" in body:
        opts["retry"] = _retry(body["retry"])
    if "visibility_timeout_s" in body:
        opts["visibility_timeout_s"] = _number(
            body["visibility_timeout_s"], "visibility_timeout_s", low=0.1, high=86400 * 7
        )
    return opts


def _window_ms(body: dict[str, Any]) -> int:
    return round(
        _number(body["catchup_window_s"], "catchup_window_s", low=0, high=MAX_WINDOW_S) * 1000
    )


def parse_schedule_create(
    body: dict[str, Any], tenant: str, *, default_queue: str, idempotency_header: str | None
) -> NewSchedule:
    """A POST /v1/schedules body as a NewSchedule."""
    _unknown(body, CREATE_FIELDS)
    paused = body.get("paused", False)
    if not isinstance(paused, bool):
        raise ValidationError("paused must be true or false", field="paused")
    key = body.get("idempotency_key", idempotency_header)
    if key is not None:
        key = _string(key, "idempotency_key")
    return NewSchedule(
        tenant=tenant,
        spec=_spec(body),
        queue=validate_name(body.get("queue", default_queue), "queue"),
        payload_json=_payload_json(body.get("payload")),
        options=_run_options(body),
        catchup=_choice(body.get("catchup", "skip"), "catchup", CATCHUPS),
        catchup_window_ms=_window_ms(body) if "catchup_window_s" in body else 3_600_000,
        overlap=_choice(body.get("overlap", "allow"), "overlap", OVERLAPS),
        max_runs=_max_runs(body.get("max_runs")),
        paused=paused,
        idempotency_key=key,
    )


def parse_schedule_patch(body: dict[str, Any], current: ScheduleSpec) -> ScheduleChanges:
    """A PATCH /v1/schedules/{id} body as ScheduleChanges (timing fields over `current`)."""
    _unknown(body, PATCH_FIELDS)
    if not body:
        raise ValidationError("nothing to change", field="cron")
    opts = _run_options(body) if {"retry", "visibility_timeout_s"} & body.keys() else None
    return ScheduleChanges(
        spec=_spec(body, current) if TIMING_FIELDS & body.keys() else None,
        queue=validate_name(body["queue"], "queue") if "queue" in body else None,
        payload_json=_payload_json(body["payload"]) if "payload" in body else None,
        options=opts,
        catchup=_choice(body["catchup"], "catchup", CATCHUPS) if "catchup" in body else None,
        catchup_window_ms=_window_ms(body) if "catchup_window_s" in body else None,
        overlap=_choice(body["overlap"], "overlap", OVERLAPS) if "overlap" in body else None,
        max_runs=_max_runs(body["max_runs"]) if "max_runs" in body else None,
    )


def parse_backfill(body: dict[str, Any]) -> tuple[int, int]:
    """A backfill body {"from": RFC 3339, "to": RFC 3339} as (from_ms, to_ms)."""
    _unknown(body, {"from", "to"})
    for name in ("from", "to"):
        if name not in body:
            raise ValidationError(f"{name} (RFC 3339) is required", field=name)
    start, end = parse_time_ms(body["from"], "from"), parse_time_ms(body["to"], "to")
    if end < start:
        raise ValidationError("to is before from", field="to")
    return start, end
