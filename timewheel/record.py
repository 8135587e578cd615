"""The task record as Lua stores it: msgpack values packed back to back, trailing nils
left out.

The field order is shared with lua/lib/record.lua; tests/test_scripts.py checks
that both sides agree.
"""

from __future__ import annotations

import json
from enum import IntEnum
from typing import Any

import msgpack

from timewheel.models import Task

FIELDS = (
    "state",
    "attempt",
    "due_ms",
    "tenant",
    "queue",
    "created_ms",
    "payload",
    "opts",
    "updated_ms",
    "last_error",
    "schedule_id",
    "dead_entry",
)


class TaskState(IntEnum):
    """States of a run (DESIGN.md section 2), as the integers the records hold."""

    SCHEDULED = 0
    DISPATCHED = 1
    SUCCEEDED = 2
    CANCELLED = 3
    DEAD = 4
    SKIPPED = 5
    """A schedule's run that was not sent: a misfire under its catchup policy, or overlap."""

    @property
    def label(self) -> str:
        return self.name.lower()


def decode_fields(raw: bytes) -> list[Any]:
    """The record's values in FIELDS order (trailing values Lua left out are None)."""
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(raw)
    values: list[Any] = list(unpacker)
    if len(values) < len(FIELDS):
        values.extend([None] * (len(FIELDS) - len(values)))
    return values


SCHEDULE_RUN_OPTS = ("catchup", "window_ms", "overlap", "next_ms", "origin")
"""Options the planner copies into a schedule's run for the tick (lua/lib/schedule.lua)."""


def decode(run_id: str, raw: bytes) -> Task:
    """A Task from a stored record."""
    v = decode_fields(raw)
    opts = json.loads(v[7]) if v[7] else {}
    if v[10] is not None:
        for name in SCHEDULE_RUN_OPTS:
            opts.pop(name, None)
    return Task(
        id=run_id.split("@", 1)[0],
        run_id=run_id,
        tenant=v[3],
        queue=v[4],
        state=TaskState(v[0]).label,
        attempt=v[1],
        due_ms=v[2],
        created_ms=v[5],
        updated_ms=v[8],
        payload_json=v[6],
        options=opts,
        last_error=v[9],
        schedule_id=v[10],
    )
