"""What an audit finds: the kinds of violation, one finding, and the tally of a pass.

Each kind is one invariant of docs/design.md that a shard's state breaks; what each
means and what to do is docs/operations/auditing.md (a test checks that every kind is
there).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum

from timewheel.types import JSONValue


class Kind(StrEnum):
    """A kind of finding, as the Lua audit operations name it."""

    RECORD_CORRUPT = "record_corrupt"
    RECORD_MISSING = "record_missing"
    NOT_IN_WHEEL = "not_in_wheel"
    WHEEL_DUPLICATE = "wheel_duplicate"
    WHEEL_MISPLACED = "wheel_misplaced"
    WHEEL_MEMBER_STALE = "wheel_member_stale"
    DUE_INDEX = "due_index"
    OVERDUE = "overdue"
    HELD_STUCK = "held_stuck"
    DISPATCHED_WITHOUT_ENTRY = "dispatched_without_entry"
    STREAM_ENTRY_ORPHAN = "stream_entry_orphan"
    DELIVERED_NOT_PENDING = "delivered_not_pending"
    LEASE_EXPIRED_UNREAPED = "lease_expired_unreaped"
    GROUP_UNWATCHED = "group_unwatched"
    SCHEDULE_UNINDEXED = "schedule_unindexed"
    SCHEDULE_OVERDUE = "schedule_overdue"
    SCHEDULE_ENDED_SILENTLY = "schedule_ended_silently"
    SHARD_UNOWNED = "shard_unowned"
    CANARY_MISSING = "canary_missing"
    RUN_LOST = "run_lost"
    EVENT_STATE_MISMATCH = "event_state_mismatch"
    ARCHIVE_RUN_LOST = "archive_run_lost"
    USAGE_MISMATCH = "usage_mismatch"
    COUNT_MISMATCH = "count_mismatch"
    ARCHIVER_BEHIND = "archiver_behind"


FOUND_IN_PYTHON = frozenset(
    {
        Kind.SHARD_UNOWNED,
        Kind.CANARY_MISSING,
        Kind.RUN_LOST,
        Kind.EVENT_STATE_MISMATCH,
        Kind.ARCHIVE_RUN_LOST,
        Kind.USAGE_MISMATCH,
        Kind.COUNT_MISMATCH,
        Kind.ARCHIVER_BEHIND,
    }
)
"""The kinds Python finds (from audit_shard's view, the canaries, the event log against
the records: events.py, the archive against Redis and the archiver's checkpoints:
archived.py); the Lua audit
operations find every other kind."""

SUMMARY: dict[Kind, str] = {
    Kind.RECORD_CORRUPT: "a record that does not decode",
    Kind.RECORD_MISSING: "a wheel member or ready-stream entry whose run has no record",
    Kind.NOT_IN_WHEEL: "a scheduled run in no level of the wheel: it would never be sent",
    Kind.WHEEL_DUPLICATE: "a scheduled run in both levels: it would be sent twice",
    Kind.WHEEL_MISPLACED: "a wheel member at the wrong time, tenant or bucket",
    Kind.WHEEL_MEMBER_STALE: "a wheel member whose run is no longer scheduled",
    Kind.DUE_INDEX: "a tenant's near level the due index lacks: the tick never serves it",
    Kind.OVERDUE: "a run still in the wheel past its due time by more than --overdue-s",
    Kind.HELD_STUCK: "a run its schedule holds back with no run in flight to release it",
    Kind.DISPATCHED_WITHOUT_ENTRY: "a dispatched run with no ready-stream entry",
    Kind.STREAM_ENTRY_ORPHAN: "a ready-stream entry of a run not dispatched at its attempt",
    Kind.DELIVERED_NOT_PENDING: "a delivered entry missing from its group's pending list",
    Kind.LEASE_EXPIRED_UNREAPED: "a pending entry idle past its lease and the grace",
    Kind.GROUP_UNWATCHED: "a consumer group the reaper does not know",
    Kind.SCHEDULE_UNINDEXED: "an active schedule missing from its plan index",
    Kind.SCHEDULE_OVERDUE: "an active schedule whose next fire time passed unplanned",
    Kind.SCHEDULE_ENDED_SILENTLY: "an ended schedule that neither end_at nor max_runs ends",
    Kind.SHARD_UNOWNED: "a shard no live scheduler node holds: its runs are not sent",
    Kind.CANARY_MISSING: "a shard's canary not acknowledged by its deadline (continuous audit)",
    Kind.RUN_LOST: "a run whose last event leaves it open but that has no record (--events)",
    Kind.EVENT_STATE_MISMATCH: "a record whose state is not what its last event says (--events)",
    Kind.ARCHIVE_RUN_LOST: "a run the archive holds open that Redis has no record of (--archive)",
    Kind.USAGE_MISMATCH: "a field of a tenant's usage hash its records do not give (--events)",
    Kind.COUNT_MISMATCH: "a tenant's open runs: Redis's count is not the archive's (--counts)",
    Kind.ARCHIVER_BEHIND: "a shard's events not archived for longer than the threshold (--archive)",
}
"""One line per kind, for the report."""

REPAIRS: dict[Kind, str] = {
    Kind.NOT_IN_WHEEL: "placed back in the wheel (lua/repair_wheel.lua)",
    Kind.DUE_INDEX: "the tenant put back in the due index (lua/repair_wheel.lua)",
    Kind.DISPATCHED_WITHOUT_ENTRY: "sent through its retry policy (lua/repair_retry.lua)",
    Kind.DELIVERED_NOT_PENDING: "handed back to the reaper (lua/repair_pending.lua)",
    Kind.GROUP_UNWATCHED: "added to the shard's groups set, as a worker does",
    Kind.SCHEDULE_UNINDEXED: "put back in its plan index (lua/repair_plan.lua)",
    Kind.USAGE_MISMATCH: "set to what the records give, if unmoved (lua/repair_usage.lua)",
}
"""The kinds `timewheel audit --repair` repairs, and how. Every other kind is reported
only: its repair would delete something, or needs a person's judgement."""

REASONS = ("unowned", "rate_held", "backlog", "unwatched", "unknown")
"""Why something is late (overdue, lease_expired_unreaped, schedule_overdue)."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One violation: its kind, where it is, and what the audit saw."""

    kind: Kind
    shard: int
    tenant: str
    id: str
    """The run id (a schedule id, or a stream key, for the kinds about those; for
    usage_mismatch the usage field)."""
    detail: str
    reason: str = ""
    """Why it is late, for the kinds that are about lateness (REASONS)."""
    data: str = field(default="", repr=False, compare=False)
    """What its repair needs (an attempt, a group and entry id); not reported."""

    def to_json(self) -> dict[str, JSONValue]:
        out: dict[str, JSONValue] = {
            "kind": self.kind.value,
            "shard": self.shard,
            "tenant": self.tenant,
            "id": self.id,
            "detail": self.detail,
        }
        if self.reason:
            out["reason"] = self.reason
        return out


class Tally:
    """The findings of a pass: every one counted by kind (and by reason), the first `keep`
    kept, so a pass over a broken deployment holds a bounded number of them."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.kept: list[Finding] = []
        self.by_kind: Counter[Kind] = Counter()
        self.by_reason: Counter[tuple[Kind, str]] = Counter()
        self.shards: dict[Kind, set[int]] = {}
        self.by_tenant: Counter[str] = Counter()
        """Findings per tenant (those that name one)."""
        self.by_tenant_kind: Counter[tuple[str, Kind]] = Counter()

    def add(self, finding: Finding) -> None:
        self.by_kind[finding.kind] += 1
        if finding.reason:
            self.by_reason[(finding.kind, finding.reason)] += 1
        self.shards.setdefault(finding.kind, set()).add(finding.shard)
        if finding.tenant:
            self.by_tenant[finding.tenant] += 1
            self.by_tenant_kind[(finding.tenant, finding.kind)] += 1
        if len(self.kept) < self.keep:
            self.kept.append(finding)

    @property
    def total(self) -> int:
        return sum(self.by_kind.values())

    @property
    def truncated(self) -> bool:
        """Whether findings were counted that are not kept."""
        return self.total > len(self.kept)
