"""A dispatched run as an executor reads it: the ready-stream envelope (docs/concepts/runs.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass

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
    return Delivery(
        stream,
        entry_id.decode(),
        fields[1].decode(),
        fields[3].decode(),
        schedule,
        fields[5].decode(),
        fields[7].decode(),
        int(fields[9] or 0),
        int(fields[11] or 0),
        int(fields[13] or 0),
        fields[15].decode(),
        visibility,
    )
