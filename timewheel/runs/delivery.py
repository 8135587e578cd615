"""A dispatched run as an executor reads it: the ready-stream envelope (docs/concepts/runs.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

from timewheel.types import JSONValue


@dataclass(frozen=True, slots=True)
class Delivery:
    """One entry of a ready stream: a run of a task, at one attempt."""

    stream: str
    entry_id: str
    run_id: str
    task_id: str
    schedule_id: str | None
    tenant: str
    queue: str
    attempt: int
    due_ms: int
    dispatched_ms: int
    payload_json: str
    visibility_timeout_ms: int | None = None
    """The task's own visibility timeout, when it set one (else the deployment default)."""

    @property
    def payload(self) -> JSONValue:
        return json.loads(self.payload_json)


def parse_entry(stream: str, entry_id: bytes, fields: dict[bytes, bytes]) -> Delivery:
    """A Delivery from one ready-stream entry (the fields lua/dispatch_tick.lua writes).

    A worker parses every run it reads, so this looks each field up once, by bytes."""
    get = fields.get
    schedule = get(b"schedule_id")
    visibility = get(b"visibility_timeout_ms")
    return Delivery(
        stream,
        entry_id.decode(),
        (get(b"run_id") or b"").decode(),
        (get(b"task_id") or b"").decode(),
        schedule.decode() if schedule else None,
        (get(b"tenant") or b"").decode(),
        (get(b"queue") or b"").decode(),
        int(get(b"attempt") or 0),
        int(get(b"due_ms") or 0),
        int(get(b"dispatched_ms") or 0),
        (get(b"payload") or b"").decode(),
        int(visibility) if visibility else None,
    )


_LEADING = [b"run_id", b"task_id", b"tenant", b"queue", b"attempt", b"due_ms", b"dispatched_ms"]
_LEADING += [b"payload"]
"""The fields every envelope starts with, in the order the tick writes them."""


def parse_fields(stream: str, entry_id: bytes, fields: list[bytes]) -> Delivery:
    """A Delivery from one entry's flat field list, as XREADGROUP returns it: read by
    position when it starts with the tick's eight fields in order (any extra fields
    follow them), else by name."""
    if fields[0:16:2] != _LEADING:
        it = iter(fields)
        return parse_entry(stream, entry_id, dict(zip(it, it, strict=True)))
    schedule = visibility = None
    for i in range(16, len(fields) - 1, 2):
        name = fields[i]
        if name == b"schedule_id":
            schedule = fields[i + 1].decode() or None
        elif name == b"visibility_timeout_ms":
            visibility = int(fields[i + 1]) if fields[i + 1] else None
    # Delivery(...) itself, its slots set as its __init__ would (see _SLOTS).
    d = _new(Delivery)
    _stream(d, stream)
    _entry_id(d, entry_id.decode())
    _run_id(d, fields[1].decode())
    _task_id(d, fields[3].decode())
    _schedule_id(d, schedule)
    _tenant(d, fields[5].decode())
    _queue(d, fields[7].decode())
    _attempt(d, int(fields[9] or 0))
    _due_ms(d, int(fields[11] or 0))
    _dispatched_ms(d, int(fields[13] or 0))
    _payload_json(d, fields[15].decode())
    _visibility_timeout_ms(d, visibility)
    return d


_SLOTS = (
    "stream",
    "entry_id",
    "run_id",
    "task_id",
    "schedule_id",
    "tenant",
    "queue",
    "attempt",
    "due_ms",
    "dispatched_ms",
    "payload_json",
    "visibility_timeout_ms",
)
"""Delivery's fields in order. A worker builds one per run: a frozen dataclass's __init__
sets each field through object.__setattr__, some 1,700 instructions a field, two thirds
of parsing an entry; parse_fields sets the slots through their descriptors instead
(the object is the same frozen Delivery). Checked against fields(Delivery) here."""
if tuple(f.name for f in fields(Delivery)) != _SLOTS:  # pragma: no cover - a field was added
    raise RuntimeError("Delivery's fields changed: update parse_fields and _SLOTS")
_new = object.__new__
(
    _stream,
    _entry_id,
    _run_id,
    _task_id,
    _schedule_id,
    _tenant,
    _queue,
    _attempt,
    _due_ms,
    _dispatched_ms,
    _payload_json,
    _visibility_timeout_ms,
) = (getattr(Delivery, name).__set__ for name in _SLOTS)
