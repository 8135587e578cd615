"""The task record as Lua stores it: msgpack values packed back to back, trailing nils
left out. Two values are stored short (records written before hold them in full): the
queue named "default" as nil, and created as created - due, a negative number (an
absolute time never is), when the run was created 1 ms to 2**31 ms before it is due.

The field order is shared with lua/lib/record.lua; a test checks
that both sides agree.
"""

from __future__ import annotations

import json
from typing import Any

import msgpack

from timewheel.tasks.model import Task
from timewheel.types import TaskState

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

STORED_AS_NIL_QUEUE = "default"
"""The queue a record stores as nil (lua/lib/record.lua record_pack): 7 bytes less in
every record of the common queue."""

SHORT_CREATED_MIN = -(2**31)
"""The least created - due stored short (4 bytes of the integer, not 8)."""


def stored_created(created_ms: int, due_ms: int) -> int:
    """The created time as lua/lib/record.lua record_pack stores it."""
    short = created_ms - due_ms
    return short if SHORT_CREATED_MIN <= short < 0 else created_ms


def pack_fresh(due_ms: int, tenant: str, queue: str, created_ms: int, payload: str) -> bytes:
    """A fresh task's record as lua/lib/record.lua record_pack packs it (no opts, no
    trailing nils; queue and created stored short), for loaders that write records
    themselves."""
    values = (
        int(TaskState.SCHEDULED),
        0,
        due_ms,
        tenant,
        None if queue == STORED_AS_NIL_QUEUE else queue,
        stored_created(created_ms, due_ms),
        payload,
    )
    return b"".join(msgpack.packb(v) for v in values)


def decode_fields(raw: bytes, sent: bool = False) -> list[Any]:
    """The record's values in FIELDS order (trailing values Lua left out are None).
    `sent`: the run was dispatched though its record says scheduled, at the next attempt
    (the tick does not rewrite records: lua/lib/record.lua, record_sent)."""
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(raw)
    values: list[Any] = list(unpacker)
    if len(values) < len(FIELDS):
        values.extend([None] * (len(FIELDS) - len(values)))
    if values[4] is None:
        values[4] = STORED_AS_NIL_QUEUE
    if isinstance(values[5], int) and values[5] < 0:
        values[5] += values[2]
    if sent and values[0] == TaskState.SCHEDULED:
        values[0], values[1] = TaskState.DISPATCHED, values[1] + 1
    return values


SCHEDULE_RUN_OPTS = ("catchup", "window_ms", "overlap", "next_ms", "origin")
"""Options the planner copies into a schedule's run for the tick (lua/lib/schedule.lua)."""


def decode(run_id: str, raw: bytes, sent: bool = False) -> Task:
    """A Task from a stored record (`sent` as in decode_fields)."""
    v = decode_fields(raw, sent)
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


def is_sent(
    run_id: str, due_ms: int, promoted_until: Any, near_score: Any, held: Any, in_far: Any
) -> bool:
    """lua/lib/record.lua record_sent, from what Redis answered: a run whose record says
    scheduled was sent if it is in neither level of the wheel (not in its tenant's near
    level; due before the shard's promoted_until, or not in its far bucket: a bucket the
    promoter drains in several calls has runs moved, and sent, ahead of promoted_until)
    and not held back by its schedule."""
    promoted = int(promoted_until) if promoted_until is not None else 0
    held_id = held.decode() if isinstance(held, bytes) else held
    if near_score is not None or held_id == run_id:
        return False
    return due_ms < promoted or not in_far
