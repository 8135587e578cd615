"""A dispatched run as an executor reads it: the ready-stream envelope (docs/concepts/runs.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from timewheel.types import JSONValue, field_text


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
    """A Delivery from one ready-stream entry (the fields lua/dispatch_tick.lua writes)."""
    schedule = fields.get(b"schedule_id")
    visibility = fields.get(b"visibility_timeout_ms")
    return Delivery(
        stream=stream,
        entry_id=entry_id.decode(),
        run_id=field_text(fields, "run_id") or "",
        task_id=field_text(fields, "task_id") or "",
        schedule_id=schedule.decode() if schedule else None,
        tenant=field_text(fields, "tenant") or "",
        queue=field_text(fields, "queue") or "",
        attempt=int(fields.get(b"attempt", b"0")),
        due_ms=int(fields.get(b"due_ms", b"0")),
        dispatched_ms=int(fields.get(b"dispatched_ms", b"0")),
        payload_json=field_text(fields, "payload") or "",
        visibility_timeout_ms=int(visibility) if visibility else None,
    )
