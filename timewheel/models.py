"""Frozen value types passed between the engine, the API and the worker."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

JSONValue = Any
"""Any value `json.loads` can return."""


def ms_to_rfc3339(ms: int) -> str:
    """Epoch milliseconds as an RFC 3339 UTC string with millisecond precision."""
    return (
        datetime.fromtimestamp(ms / 1000, tz=UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


@dataclass(frozen=True, slots=True)
class Task:
    """A one-shot task (or a schedule's run) as stored."""

    id: str
    run_id: str
    tenant: str
    queue: str
    state: str
    """scheduled | dispatched | succeeded | cancelled | dead"""
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

    def to_json(self) -> dict[str, JSONValue]:
        """The public representation (HTTP API)."""
        out: dict[str, JSONValue] = {
            "id": self.id,
            "run_id": self.run_id,
            "queue": self.queue,
            "state": self.state,
            "attempt": self.attempt,
            "run_at": ms_to_rfc3339(self.due_ms),
            "created_at": ms_to_rfc3339(self.created_ms),
            "updated_at": ms_to_rfc3339(self.updated_ms) if self.updated_ms else None,
            "payload": self.payload,
            "last_error": self.last_error,
        }
        out.update(self.options)
        if self.schedule_id:
            out["schedule_id"] = self.schedule_id
        return out


@dataclass(frozen=True, slots=True)
class CreateResult:
    """What a create did: `created` is False for an idempotent duplicate."""

    task: Task | None
    task_id: str
    created: bool
    due_ms: int
    wake: bool = False
    created_ms: int | None = None
    """The created time the record holds (shard clock), for a new task."""


LAG_BUCKETS_MS: tuple[int, ...] = (2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 60000)
"""Upper bounds (inclusive) of the dispatch lag histogram a tick counts into."""


@dataclass(frozen=True, slots=True)
class TickResult:
    """One tick of one shard."""

    shard: int
    dispatched: int
    """Runs written to ready streams."""
    consumed: int
    """Near-level entries taken (stale ones included); equal to the limit means more due now."""
    next_due_ms: int | None
    now_ms: int
    """The shard's clock as the tick used it (max of TIME and the high-water mark)."""
    clock_back_ms: int
    """How far TIME stood behind the high-water mark (0 normally)."""
    next_bucket_ms: int | None
    promoted_until_ms: int
    per_tenant: dict[str, int] = field(default_factory=dict)
    """Runs dispatched per tenant."""
    lag_counts: list[int] = field(default_factory=list)
    """Dispatched runs by lag (the tick's clock minus the due time): the i-th count is of
    lags <= LAG_BUCKETS_MS[i], the last of lags past every bound; empty if none was sent."""
    lag_sum_ms: int = 0
    """The dispatched runs' lags added up."""
    backlog: int = 0
    """Runs still due after the call (counted only when the call hit its limit)."""
    held: dict[str, int] = field(default_factory=dict)
    """Per tenant held back by its dispatch rate: its runs still due in this shard."""


@dataclass(frozen=True, slots=True)
class PromoteResult:
    """One promote call on one shard."""

    shard: int
    moved: int
    more: bool
    promoted_until_ms: int
    next_bucket_ms: int | None


@dataclass(frozen=True, slots=True)
class Delivery:
    """A dispatched run as an executor reads it from a ready stream (DESIGN.md section 6)."""

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
