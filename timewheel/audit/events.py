"""The event log against the records: each run the newest entries of a shard's event log
name must be in the state its last event there left it in (docs/operations/auditing.md,
`run_lost` and `event_state_mismatch`).

Every script that changes a run writes its event in the same call, so a run's record
and its last event agree, but for runs whose record is gone on purpose: a finished run
past its retention (expiry writes no event) or a purged dead letter. The check is exact
under load: it reads a window of the log up to an entry L, then the records of the runs
named there, then every entry after L; a run named after L changed meanwhile and is not
judged.

Bounded: the window is the newest ENTRIES_PER_SHARD entries of the shard's log, and at
most RUNS_PER_SHARD runs of them are judged; a step reads at most `batch` entries or
records. A pass whose window start was trimmed away before it ended judges nothing
(an event it relied on may be gone): a log of big batched entries is short (its cap
counts runs, lua/lib/events.lua), so under a steady stream of them a shard's check
may wait for a calmer pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisError

from timewheel.archive.events import event_rows
from timewheel.audit.findings import Finding, Kind
from timewheel.errors import RedisUnavailable
from timewheel.store import record
from timewheel.store.shard import Store
from timewheel.types import TaskState, text

ENTRIES_PER_SHARD = 1000
"""Newest event-log entries of a shard a pass reads."""
RUNS_PER_SHARD = 5000
"""Runs of those entries a pass judges at most."""

OPEN = "open"
"""Scheduled, dispatched or waiting for a retry: a record that says scheduled or
dispatched (a dispatched run's record is not rewritten by the tick)."""
AFTER: dict[str, str | None] = {
    "created": OPEN,
    "updated": OPEN,
    "dispatched": OPEN,
    "retry_scheduled": OPEN,
    "replayed": OPEN,
    "held": OPEN,
    "acked": TaskState.SUCCEEDED.label,
    "cancelled": TaskState.CANCELLED.label,
    "dead": TaskState.DEAD.label,
    "skipped": TaskState.SKIPPED.label,
}
"""The state a run is in after its last event (None or absent: not judged, e.g. purged)."""
OPEN_STATES = frozenset({TaskState.SCHEDULED.label, TaskState.DISPATCHED.label})


@dataclass(slots=True)
class _Seen:
    kind: str
    tenant: str


@dataclass(slots=True)
class EventCheck:
    """One shard's event-log check, a step at a time."""

    store: Store
    shard: int
    batch: int
    phase: str = "start"
    """start -> window -> records -> after -> done"""
    upto: str = ""
    """The window's last entry id (L)."""
    cursor: str = ""
    first: str = ""
    """The window's first entry id: the log must still hold it when the pass ends."""
    seen: dict[str, _Seen] = field(default_factory=dict)
    records: dict[str, bytes | None] = field(default_factory=dict)
    pending: list[str] = field(default_factory=list)
    examined: int = 0

    @property
    def done(self) -> bool:
        return self.phase == "done"

    async def step(self) -> tuple[int, list[Finding]]:
        """One call's worth; (things read, findings)."""
        try:
            if self.phase == "start":
                return await self._start(), []
            if self.phase == "window":
                return await self._window(), []
            if self.phase == "records":
                return await self._records(), []
            if self.phase == "after":
                return await self._after()
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"reading the event log of shard {self.shard}: {exc}") from exc
        return 0, []

    async def _start(self) -> int:
        client, key = self.store.client, self.store.keys.events(self.shard)
        window: Any = await client.xrevrange(key, count=ENTRIES_PER_SHARD)
        if not window:
            self.phase = "done"
            return 1
        self.upto = _id(window[0][0])
        self.cursor = self.first = _id(window[-1][0])
        self.phase = "window"
        return 2

    async def _window(self) -> int:
        """Entries from cursor to L, `batch` at a time: the last event of each run."""
        client, key = self.store.client, self.store.keys.events(self.shard)
        entries: Any = await client.xrange(key, min=self.cursor, max=self.upto, count=self.batch)
        for entry_id, fields in entries:
            for row in event_rows(self.shard, entry_id, fields):
                run_id, kind, tenant = row[3], row[4], row[6]
                if not run_id or (kind not in AFTER and kind != "purged"):
                    continue
                if run_id not in self.seen and len(self.seen) >= RUNS_PER_SHARD:
                    continue
                before = self.seen.get(run_id)
                self.seen[run_id] = _Seen(kind, tenant or (before.tenant if before else ""))
        if len(entries) < self.batch or _id(entries[-1][0]) == self.upto:
            self.phase = "records"
            self.pending = sorted(self.seen)
        else:
            self.cursor = "(" + _id(entries[-1][0])
        return max(1, len(entries))

    async def _records(self) -> int:
        chunk, self.pending = self.pending[: self.batch], self.pending[self.batch :]
        raws = await self.store.records([(self.shard, run_id) for run_id in chunk])
        for run_id, raw in zip(chunk, raws, strict=True):
            self.records[run_id] = raw
        if not self.pending:
            self.phase = "after"
            self.cursor = "(" + self.upto
        return max(1, len(chunk))

    async def _after(self) -> tuple[int, list[Finding]]:
        """Entries after L: the runs they name changed since and are not judged."""
        client, key = self.store.client, self.store.keys.events(self.shard)
        entries: Any = await client.xrange(key, min=self.cursor, max="+", count=self.batch)
        for entry_id, fields in entries:
            for row in event_rows(self.shard, entry_id, fields):
                self.records.pop(row[3], None)
        if len(entries) == self.batch:
            self.cursor = "(" + _id(entries[-1][0])
            return len(entries), []
        self.phase = "done"
        kept: Any = await client.xrange(key, min=self.first, max=self.first)
        if not kept:  # trimmed past the window's start meanwhile: not judged this pass
            self.records = {}
        findings = [f for run_id in sorted(self.records) if (f := self._judge(run_id))]
        self.examined = len(self.records)
        self.seen, self.records = {}, {}
        return max(1, len(entries)), findings

    def _judge(self, run_id: str) -> Finding | None:
        seen, raw = self.seen[run_id], self.records[run_id]
        expected = AFTER.get(seen.kind)
        if expected is None:
            return None
        if raw is None:
            if expected != OPEN:
                return None  # finished, then expired (or purged): gone on purpose
            return Finding(
                Kind.RUN_LOST,
                self.shard,
                seen.tenant,
                run_id,
                f"its last event is {seen.kind!r} but it has no record (no purge, not finished)",
            )
        task = record.decode(run_id, raw)
        state = task.state
        fine = state in OPEN_STATES if expected == OPEN else state == expected
        if fine:
            return None
        return Finding(
            Kind.EVENT_STATE_MISMATCH,
            self.shard,
            task.tenant,
            run_id,
            f"its record says {state} but its last event is {seen.kind!r}",
        )


def _id(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


# -- usage counts --------------------------------------------------------------------------

USAGE_EVENTS_READ = 10_000
"""Event-log entries after the records phase began that the usage check reads at most; a
shard busier than that during its records phase is not checked this pass."""
USAGE_FIELDS = ("schedules", "bytes")
"""The fields of a usage hash besides q:<queue> (lua/lib/usage.lua)."""


def usage_field(key: str) -> tuple[str, str] | None:
    """(tenant, usage field) of one of audit_records' usage counts ('#uq:<tenant>|<queue>',
    '#us:<tenant>', '#ub:<tenant>'), None for any other key of its per-key list."""
    if key.startswith("#uq:"):
        tenant, _, queue = key[4:].partition("|")
        return tenant, "q:" + queue
    if key.startswith("#us:"):
        return key[4:], "schedules"
    if key.startswith("#ub:"):
        return key[4:], "bytes"
    return None


async def usage_mark(store: Store, shard: int) -> str:
    """The shard's last event-log entry id now ('0-0' for an empty log)."""
    try:
        newest: Any = await store.client.xrevrange(store.keys.events(shard), count=1)
    except (RedisError, OSError) as exc:
        raise RedisUnavailable(f"reading the event log of shard {shard}: {exc}") from exc
    return _id(newest[0][0]) if newest else "0-0"


def _count(raw: str | None) -> int | None:
    if raw is None:
        return 0
    try:
        return int(raw)
    except ValueError:
        return None


async def usage_findings(
    store: Store,
    shard: int,
    since: str,
    tenants: list[str],
    found: dict[str, dict[str, int]],
) -> list[Finding]:
    """Each field of each tenant's usage hash (q:<queue>, schedules, bytes) against what
    the records phase found (`found`: tenant -> field -> count), for the tenants no event
    has named since `since` (the log's last entry when the records phase began): every
    operation that changes a tenant's usage names the tenant in its event, so for the
    others neither side moved meanwhile. One finding per field that differs: its id the
    field, its data what lua/repair_usage.lua needs (field|expected|read|since, read being
    the field's value as read, '' for none)."""
    if not tenants:
        return []
    keys, client = store.keys, store.client
    try:
        pipe = client.pipeline(transaction=False)
        for tenant in tenants:
            pipe.hgetall(keys.usage(shard, tenant))
        hashes: list[Any] = await pipe.execute()
        entries: Any = await client.xrange(
            keys.events(shard), min="(" + since, max="+", count=USAGE_EVENTS_READ
        )
        # An empty log at the mark ('0-0'): every entry came after it.
        kept = since == "0-0" or bool(await client.xrange(keys.events(shard), min=since, max=since))
    except (RedisError, OSError) as exc:
        raise RedisUnavailable(f"reading usage counts of shard {shard}: {exc}") from exc
    if len(entries) >= USAGE_EVENTS_READ or not kept:
        return []  # busy, or trimmed past `since`: an event naming a tenant may be gone
    moved = {row[6] for entry_id, fields in entries for row in event_rows(shard, entry_id, fields)}
    out = []
    for tenant, raw in zip(tenants, hashes, strict=True):
        if tenant in moved:
            continue
        held = {text(k): text(v) for k, v in (raw or {}).items()}
        expected = found.get(tenant, {})
        names = {f for f in held if f.startswith("q:") or f in USAGE_FIELDS} | set(expected)
        for name in sorted(names):
            read = held.get(name)
            want = expected.get(name, 0)
            if _count(read) == want:
                continue
            counted = "nothing" if read is None else read
            out.append(
                Finding(
                    Kind.USAGE_MISMATCH,
                    shard,
                    tenant,
                    name,
                    f"use:{tenant} {name}: the records give {want}, the hash counts {counted}",
                    data=f"{name}|{want}|{read or ''}|{since}",
                )
            )
    return out
