"""A one-shot task: the create request, the task as stored, and its one JSON rendering."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from timewheel.types import JSONValue, TaskState, ms_to_rfc3339


@dataclass(frozen=True, slots=True)
class NewTask:
    """A create request, already validated at the edge (times in epoch ms)."""

    tenant: str
    payload_json: str = "null"
    queue: str = "default"
    run_at_ms: int | None = None
    delay_ms: int | None = None
    idempotency_key: str | None = None
    options: Mapping[str, JSONValue] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Task:
    """A one-shot task (or a schedule's run) as stored."""

    id: str
    run_id: str
    tenant: str
    queue: str
    state: str
    """A TaskState label: scheduled | dispatched | succeeded | cancelled | dead | skipped"""
    attempt: int
    """Dispatches so far; the envelope of the first dispatch says 1."""
    due_ms: int
    """When the run is (or was) due, epoch ms."""
    created_ms: int
    updated_ms: int | None
    """Last change by a client or an outcome (update, cancel, ack, fail), epoch ms. A
    dispatch leaves it alone (the tick patches only state and attempt); the run
    history and the envelope's dispatched_ms say when it went out."""
    payload_json: str
    """The payload exactly as the client sent it, as JSON text."""
    options: dict[str, JSONValue] = field(default_factory=dict)
    """Non-default policy fields (retry policy, visibility timeout, expiry)."""
    last_error: str | None = None
    schedule_id: str | None = None

    @property
    def payload(self) -> JSONValue:
        return json.loads(self.payload_json)

    @classmethod
    def created(cls, task_id: str, new: NewTask, due_ms: int, created_ms: int) -> Task:
        """The task a create just stored, as a read would return it (no second round trip)."""
        return cls(
            id=task_id,
            run_id=task_id,
            tenant=new.tenant,
            queue=new.queue,
            state=TaskState.SCHEDULED.label,
            attempt=0,
            due_ms=due_ms,
            created_ms=created_ms,
            updated_ms=None,
            payload_json=new.payload_json,
            options=dict(new.options),
        )

    def to_json(self) -> dict[str, JSONValue]:
        """The public representation: the same from create, batch, get and list."""
        return self.json_fields(self.payload)

    def json_fields(self, payload: object) -> dict[str, JSONValue]:
        """to_json with `payload` in place of the parsed payload (an encoder's raw JSON
        text of it, which spares parsing the payload only to encode it again)."""
        out: dict[str, JSONValue] = {
            "id": self.id,
            "run_id": self.run_id,
            "queue": self.queue,
            "state": self.state,
            "attempt": self.attempt,
            "run_at": ms_to_rfc3339(self.due_ms),
            "created_at": ms_to_rfc3339(self.created_ms),
            "updated_at": ms_to_rfc3339(self.updated_ms) if self.updated_ms else None,
            "payload": payload,
            "last_error": self.last_error,
        }
        out.update(self.options)
        if self.schedule_id:
            out["schedule_id"] = self.schedule_id
        return out


@dataclass(frozen=True, slots=True)
class CreateResult:
    """What a create did: `created` is False for an idempotent duplicate, and `task` is
    then the task that was already there."""

    task: Task
    created: bool
    wake: bool = False
    """The create moved its shard's next due time earlier (it announced a wake-up)."""

    @property
    def task_id(self) -> str:
        return self.task.id

    @property
    def due_ms(self) -> int:
        return self.task.due_ms
