"""A recurring schedule: the create and change requests, the schedule as stored, its
JSON rendering, and how its timing and run options are stored."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from timewheel.errors import ValidationError
from timewheel.schedules.spec import ScheduleSpec
from timewheel.tasks import window
from timewheel.types import CATCHUPS, OVERLAPS, JSONValue, ms_to_rfc3339, optional_rfc3339


@dataclass(frozen=True, slots=True)
class NewSchedule:
    """A schedule create request, validated at the edge (times in epoch ms)."""

    tenant: str
    spec: ScheduleSpec
    queue: str = "default"
    payload_json: str = "null"
    options: dict[str, JSONValue] = field(default_factory=dict)
    """Options every run gets: retry, visibility_timeout_s; and jitter_s."""
    catchup: str = "skip"
    catchup_window_ms: int = 3_600_000
    overlap: str = "allow"
    max_runs: int = 0
    """0 = no limit."""
    paused: bool = False
    idempotency_key: str | None = None

    def __post_init__(self) -> None:
        if self.catchup not in CATCHUPS:
            raise ValidationError(f"catchup must be one of {', '.join(CATCHUPS)}", field="catchup")
        if self.overlap not in OVERLAPS:
            raise ValidationError(f"overlap must be one of {', '.join(OVERLAPS)}", field="overlap")


@dataclass(frozen=True, slots=True)
class ScheduleChanges:
    """A schedule update: None keeps the current value. Values that depend on the current
    schedule are applied to it by update_schedule, against the version it read."""

    spec: ScheduleSpec | Callable[[ScheduleSpec], ScheduleSpec] | None = None
    """A whole new timing, or a function of the current one (a PATCH of some fields)."""
    queue: str | None = None
    payload_json: str | None = None
    options: dict[str, JSONValue] | None = None
    """Run options set over the current ones (retry, visibility_timeout_s, jitter_s)."""
    catchup: str | None = None
    catchup_window_ms: int | None = None
    overlap: str | None = None
    max_runs: int | None = None


@dataclass(frozen=True, slots=True)
class Schedule:
    """A recurring schedule as stored."""

    id: str
    tenant: str
    queue: str
    spec: ScheduleSpec
    payload_json: str
    options: dict[str, JSONValue]
    catchup: str
    catchup_window_ms: int
    overlap: str
    max_runs: int
    state: str
    """active | paused | ended"""
    next_run_ms: int | None
    last_run_ms: int | None
    runs_planned: int
    created_ms: int
    updated_ms: int
    version: int = 0
    """Bumped by every change (update, pause, resume): what an update checks it read."""

    def to_json(self) -> dict[str, JSONValue]:
        """The public representation (HTTP API)."""
        spec = self.spec
        out: dict[str, JSONValue] = {"id": self.id, "queue": self.queue}
        if spec.cron is not None:
            out["cron"] = spec.cron
            out["timezone"] = spec.timezone
        else:
            every = spec.every_s or 0.0
            out["every_s"] = int(every) if float(every).is_integer() else every
        out.update(
            {
                "start_at": optional_rfc3339(spec.start_at_ms),
                "end_at": optional_rfc3339(spec.end_at_ms),
                "max_runs": self.max_runs or None,
                "payload": json.loads(self.payload_json),
                "catchup": self.catchup,
                "catchup_window_s": self.catchup_window_ms / 1000,
                "overlap": self.overlap,
                "state": self.state,
                "paused": self.state == "paused",
                "next_run_at": optional_rfc3339(self.next_run_ms),
                "last_run_at": optional_rfc3339(self.last_run_ms),
                "runs_planned": self.runs_planned,
                "created_at": ms_to_rfc3339(self.created_ms),
                "updated_at": ms_to_rfc3339(self.updated_ms),
            }
        )
        out.update(self.options)
        return out


def spec_json(spec: ScheduleSpec) -> str:
    return json.dumps(
        {
            "cron": spec.cron,
            "timezone": spec.timezone,
            "every_s": spec.every_s,
            "start_ms": spec.start_at_ms,
            "end_ms": spec.end_at_ms,
            "anchor_ms": spec.anchor_ms,
        },
        separators=(",", ":"),
    )


def spec_from_json(text: str) -> ScheduleSpec:
    """A stored spec (spec_json's text), not checked again (ScheduleSpec.stored)."""
    d = json.loads(text)
    return ScheduleSpec.stored(
        cron=d["cron"],
        timezone=d["timezone"],
        every_s=d["every_s"],
        start_at_ms=d["start_ms"],
        end_at_ms=d["end_ms"],
        anchor_ms=d.get("anchor_ms"),
    )


def jittered(sid: str, options: dict[str, JSONValue]) -> dict[str, JSONValue]:
    """Run options with the schedule's jitter offset for their jitter_s (lua/lib/schedule.lua
    makes each run due that long after its fire time). Raises ValidationError."""
    jitter_ms = window.option_ms(options, "jitter_s")
    out = {k: v for k, v in options.items() if k != "jitter_offset_ms"}
    if jitter_ms:
        out["jitter_offset_ms"] = window.offset_ms(sid, jitter_ms)
    return out
