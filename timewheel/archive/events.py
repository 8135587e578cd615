"""What an event-log entry becomes in PostgreSQL: run_events rows and task changes.

Pure functions of an entry's fields (no I/O), used by the archiver (timewheel/archive/archiver.py);
restore replays the rows they produce (timewheel/archive/replay.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from timewheel.types import field_int, field_text

StreamId = tuple[int, int]
"""A stream entry id '<ms>-<seq>' as two integers (sorts like the id)."""

EVENT_COLUMNS = (
    "shard",
    "id_ms",
    "id_seq",
    "run_id",
    "kind",
    "at_ms",
    "tenant",
    "queue",
    "attempt",
    "due_ms",
    "reason",
    "error",
    "node",
    "epoch",
    "payload",
    "opts",
)
"""Columns of run_events, in the order event_rows builds each row."""

# The state a run is in after each kind of event (the tasks table's view).
STATE_AFTER = {
    "created": "scheduled",
    "updated": "scheduled",
    "cancelled": "cancelled",
    "dispatched": "dispatched",
    "acked": "succeeded",
    "retry_scheduled": "scheduled",
    "dead": "dead",
    "replayed": "scheduled",
    "purged": "purged",
    "skipped": "skipped",
    "held": "scheduled",
}


def parse_id(raw: bytes | str) -> StreamId:
    """'1700000000000-3' -> (1700000000000, 3)."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def format_id(stream_id: StreamId) -> str:
    return f"{stream_id[0]}-{stream_id[1]}"


def created_runs(fields: dict[bytes, bytes]) -> list[tuple[str, str, str, int]]:
    """(run_id, tenant, queue, due_ms) of each run a 'created' entry names: one create call
    writes one entry, runs = 'id:tenant:queue:due_ms,...'. Entries written before that
    name one run in id, tenant, queue and due_ms fields."""
    if b"runs" not in fields:
        run_id = field_text(fields, "id")
        if run_id is None:
            return []
        return [
            (run_id, field_text(fields, "tenant") or "", field_text(fields, "queue") or "",
             field_int(fields, "due_ms") or 0)
        ]  # fmt: skip
    out = []
    for item in fields[b"runs"].split(b","):
        parts = item.split(b":")
        if len(parts) == 4 and parts[3].isdigit():
            out.append((parts[0].decode(), parts[1].decode(), parts[2].decode(), int(parts[3])))
    return out


@dataclass(frozen=True, slots=True)
class BatchedRun:
    """One run of an entry that names several (acked, retry_scheduled)."""

    run_id: str
    tenant: str
    attempt: int
    due_ms: int | None = None
    error: str | None = None


BATCHED = ("acked", "retry_scheduled")
"""Kinds whose entries name many runs in `runs` (one entry per call) when they have it;
entries written before that name one run in id, tenant, attempt (due_ms, error) fields."""


def batched_runs(kind: str, fields: dict[bytes, bytes]) -> list[BatchedRun]:
    """The runs a batched acked or retry_scheduled entry names: runs =
    'id:tenant:attempt,...' (acked) or 'id:tenant:attempt:due_ms,...' (retry_scheduled),
    with the error in `error` when every retry has the same, else `errors`, a JSON array
    in the order of runs. Items it cannot read are left out."""
    errors: list[Any] = []
    if kind == "retry_scheduled" and b"errors" in fields:
        try:
            loaded = json.loads(fields[b"errors"])
        except ValueError:
            loaded = []
        errors = loaded if isinstance(loaded, list) else []
    shared = field_text(fields, "error")
    width = 4 if kind == "retry_scheduled" else 3
    out: list[BatchedRun] = []
    for n, item in enumerate(fields.get(b"runs", b"").split(b",")):
        parts = item.split(b":")
        if len(parts) != width or not all(p.isdigit() for p in parts[2:]):
            continue
        error = shared
        if n < len(errors) and isinstance(errors[n], str):
            error = errors[n] or None
        due = int(parts[3]) if width == 4 else None
        out.append(BatchedRun(parts[0].decode(), parts[1].decode(), int(parts[2]), due, error))
    return out


def event_rows(shard: int, entry_id: bytes, fields: dict[bytes, bytes]) -> list[list[Any]]:
    """The run_events rows of one event-log entry (payload and opts left None)."""
    ms, seq = parse_id(entry_id)
    # Tolerant of kinds added later (schedules): whatever names no run is stored with
    # run_id '' rather than stopping the archiver on an entry it cannot read.
    kind = field_text(fields, "e") or "unknown"
    at_ms = field_int(fields, "at") or ms
    common = [field_text(fields, "reason"), field_text(fields, "error")]
    node, epoch = field_text(fields, "node"), field_text(fields, "epoch")
    if kind == "dispatched":
        rows = []
        for item in fields.get(b"runs", b"").split(b","):
            run_id, _, attempt = item.rpartition(b":")
            if not run_id or not attempt.isdigit():
                continue
            rows.append(
                [
                    shard,
                    ms,
                    seq,
                    run_id.decode(),
                    kind,
                    at_ms,
                    None,
                    None,
                    int(attempt),
                    None,
                    *common,
                    node,
                    epoch,
                    None,
                    None,
                ]
            )
        return rows
    if kind in BATCHED and b"runs" in fields:
        reason = field_text(fields, "reason")
        return [
            [shard, ms, seq, b.run_id, kind, at_ms, b.tenant, None, b.attempt, b.due_ms,
             reason, b.error, node, epoch, None, None]
            for b in batched_runs(kind, fields)
        ]  # fmt: skip
    if kind == "created":
        return [
            [shard, ms, seq, run_id, kind, at_ms, tenant, queue, None, due_ms, *common, node,
             epoch, None, None]
            for run_id, tenant, queue, due_ms in created_runs(fields)
        ]  # fmt: skip
    return [
        [
            shard,
            ms,
            seq,
            field_text(fields, "id") or "",
            kind,
            at_ms,
            field_text(fields, "tenant"),
            field_text(fields, "queue"),
            field_int(fields, "attempt"),
            field_int(fields, "due_ms"),
            *common,
            node,
            epoch,
            None,
            None,
        ]
    ]


@dataclass(slots=True)
class TaskChange:
    """What a batch of events says about one run, folded in order (None = unchanged)."""

    shard: int
    state: str = "scheduled"
    values: dict[str, Any] = field(default_factory=dict)

    def apply(self, row: Sequence[Any]) -> None:
        ev = dict(zip(EVENT_COLUMNS, row, strict=True))
        kind = ev["kind"]
        self.state = STATE_AFTER.get(kind, self.state)
        v = self.values
        for name in ("tenant", "queue", "payload", "opts"):
            if ev[name] is not None:
                v[name] = ev[name]
        if kind == "created":
            v.update(attempt=0, due_ms=ev["due_ms"], created_ms=ev["at_ms"])
        elif kind == "replayed":
            v.update(attempt=0, due_ms=ev["at_ms"], updated_ms=ev["at_ms"])
        else:
            v["updated_ms"] = ev["at_ms"]
            if ev["attempt"] is not None:
                v["attempt"] = ev["attempt"]
            if ev["due_ms"] is not None:
                v["due_ms"] = ev["due_ms"]
            if ev["error"] is not None:
                v["last_error"] = ev["error"]

    def params(self, run_id: str) -> tuple[Any, ...]:
        v = self.values
        return (
            run_id,
            self.shard,
            v.get("tenant"),
            v.get("queue"),
            self.state,
            v.get("attempt"),
            v.get("due_ms"),
            v.get("created_ms"),
            v.get("updated_ms"),
            v.get("payload"),
            v.get("opts"),
            v.get("last_error"),
        )
