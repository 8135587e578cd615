"""The audit's calls of the Lua operations (lua/audit_*.lua, lua/repair_*.lua) and the
decoders of their replies.

Every audit call reads a bounded step (at most `AuditOptions.batch` records, entries or
members, or one listpack-encoded hash past it) and answers where to go on and the
findings of that step, six values each: kind, tenant, id, reason, detail, data. So a
pass moves only cursors and findings over the wire.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from timewheel.audit.findings import Finding, Kind
from timewheel.store.bodies import WALK_END
from timewheel.store.shard import Call, Store, clock_arg
from timewheel.types import text

BODY_HASHES = WALK_END
"""The end of a walk of a shard's body hashes (store/bodies.py): audit_records is done at
this position, or, counting usage, goes on there with the shard's schedules."""
RECORDS_DONE_USAGE = BODY_HASHES + 1
"""audit_records counting usage is done at this index (the schedules read too)."""
MAX_BATCH = 500
"""Most records, entries or members one audit call reads (besides one listpack hash)."""
MAX_KEYS_PER_CALL = 64
"""Most near levels or far buckets one audit call is given to read in turn."""
DUE_TENANTS_READ = 1000
"""Most tenants of the due index audit_shard counts due runs for."""
REPAIR_USAGE_EVENTS_READ = 10_000
"""Most event-log entries after the records phase's start repair_usage reads to see that
no event named the tenant; past that it refuses ('busy')."""
REAPER_CONSUMER = "timewheel-audit"
"""The consumer repair_pending hands an entry to, for the reaper to take."""


@dataclass(frozen=True, slots=True)
class AuditOptions:
    """What a pass checks against and how much it reads per call."""

    overdue_ms: int = 60_000
    """A run still in the wheel this long after its due time is overdue."""
    lease_grace_ms: int = 30_000
    """How long past its visibility timeout a pending entry may wait for the reaper."""
    batch: int = MAX_BATCH
    """Records, entries or members per call (<= MAX_BATCH)."""
    scratch_ttl_ms: int = 600_000
    """TTL of a pass's scratch hash in each shard, renewed by every call that writes it."""
    now_ms: int | None = None
    """A clock override for the shard clock (tests); None: Redis TIME."""
    events: bool = False
    """Check the newest entries of each shard's event log against the records too
    (events.py): `timewheel audit --events`, and the continuous auditor."""

    def __post_init__(self) -> None:
        if not 1 <= self.batch <= MAX_BATCH:
            raise ValueError(f"batch must be 1..{MAX_BATCH}")


@dataclass(frozen=True, slots=True)
class ShardView:
    """What audit_shard reads first: the shard clock and its state around the tick."""

    now_ms: int
    promoted_until: int
    lease: str
    """'<node>/<epoch>' of the owning scheduler node, '' for none."""
    due_runs: int
    """Runs due now in the near level (over the earliest DUE_TENANTS_READ tenants)."""


@dataclass(frozen=True, slots=True)
class Step:
    """One audit call's answer: where to go on, how much it read, what it found."""

    position: int
    """audit_records: the body hash index; audit_near, audit_far: keys read to their end;
    otherwise 0."""
    cursor: str
    """Where to go on ('' or '0' once done, as each operation says)."""
    examined: int
    findings: list[Finding]
    counted: int = 0
    """audit_near, audit_far: members accounted for by their number, not read."""
    placed: dict[str, int] | None = None
    """audit_records: near level or far bucket -> the scheduled runs found in it."""


def _text(value: object) -> str:
    """A reply value as text; bytes that are not UTF-8 (a stream entry's run_id of any
    bytes) are shown, not refused."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def findings_of(shard: int, flat: Sequence[Any]) -> list[Finding]:
    """The findings of a reply's tail: six values each."""
    out = []
    for i in range(0, len(flat) - 5, 6):
        kind, tenant, run_id, reason, detail, data = (_text(v) for v in flat[i : i + 6])
        out.append(Finding(Kind(kind), shard, tenant, run_id, detail, reason, data))
    return out


def _step3(shard: int) -> Any:
    """{position, cursor, examined, findings...} replies."""

    def decode(reply: list[Any]) -> Step:
        return Step(int(reply[0]), text(reply[1]), int(reply[2]), findings_of(shard, reply[3:]))

    return decode


def _records(shard: int) -> Any:
    """{index, cursor, examined, {key, runs, ...}, findings...} replies."""

    def decode(reply: list[Any]) -> Step:
        flat = reply[3]
        placed = {text(flat[i]): int(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}
        findings = findings_of(shard, reply[4:])
        return Step(int(reply[0]), text(reply[1]), int(reply[2]), findings, placed=placed)

    return decode


def _members(shard: int) -> Any:
    """{done, cursor, read, counted, findings...} replies."""

    def decode(reply: list[Any]) -> Step:
        findings = findings_of(shard, reply[4:])
        return Step(int(reply[0]), text(reply[1]), int(reply[2]), findings, int(reply[3]))

    return decode


def _step2(shard: int) -> Any:
    """{cursor, examined, findings...} replies."""

    def decode(reply: list[Any]) -> Step:
        return Step(0, text(reply[0]), int(reply[1]), findings_of(shard, reply[2:]))

    return decode


def _view(reply: list[Any]) -> ShardView:
    return ShardView(int(reply[0]), int(reply[1]), text(reply[2]), int(reply[3]))


def _code(reply: list[Any]) -> tuple[int, str]:
    return int(reply[0]), text(reply[1]) if len(reply) > 1 else ""


class AuditCalls:
    """The audit and repair calls of one deployment."""

    def __init__(self, store: Store, options: AuditOptions):
        self.store = store
        self.options = options
        self.scripts = store.scripts
        self.keys = store.keys

    def shard(self, shard: int) -> Call[ShardView]:
        k = self.keys
        return Call(
            self.scripts.audit_shard,
            [k.meta(shard), k.due(shard)],
            [clock_arg(self.options.now_ms), DUE_TENANTS_READ],
            _view,
        )

    def records(
        self, shard: int, scratch: str, index: int, cursor: str, backlog: bool
    ) -> Call[Step]:
        o, s = self.options, self.store.settings
        return Call(
            self.scripts.audit_records,
            [self.keys.meta(shard), scratch],
            [
                index,
                cursor,
                o.batch,
                clock_arg(o.now_ms),
                o.overdue_ms,
                s.bucket_ms,
                o.scratch_ttl_ms,
                "1" if backlog else "0",
                "1" if o.events else "0",
            ],
            _records(shard),
        )

    def streams(self, shard: int, scratch: str, streams: Sequence[str], after: str) -> Call[Step]:
        o, s = self.options, self.store.settings
        return Call(
            self.scripts.audit_stream,
            [scratch, *streams],
            [
                after,
                o.batch,
                s.visibility_timeout_ms,
                s.min_visibility_timeout_ms,
                o.lease_grace_ms,
                s.bucket_ms,
                o.scratch_ttl_ms,
            ],
            _step3(shard),
        )

    def confirm(self, shard: int, scratch: str, cursor: str) -> Call[Step]:
        return Call(
            self.scripts.audit_confirm,
            [self.keys.meta(shard), scratch],
            [cursor, self.options.batch, self.store.settings.bucket_ms],
            _step2(shard),
        )

    def near(
        self, shard: int, near_keys: Sequence[str], cursor: str, expected: Sequence[int]
    ) -> Call[Step]:
        """Near levels from `cursor` in the first; `expected`: the runs audit_records found
        in each (a level of exactly that size is not read member by member)."""
        return Call(
            self.scripts.audit_near,
            list(near_keys),
            [
                cursor,
                self.options.batch,
                clock_arg(self.options.now_ms),
                self.store.settings.bucket_ms,
                *expected,
            ],
            _members(shard),
        )

    def far(
        self, shard: int, bucket_keys: Sequence[str], cursor: str, expected: Sequence[int]
    ) -> Call[Step]:
        """Far buckets, as `near`."""
        return Call(
            self.scripts.audit_far,
            list(bucket_keys),
            [cursor, self.options.batch, self.store.settings.bucket_ms, *expected],
            _members(shard),
        )

    def schedules(self, shard: int, cursor: str) -> Call[Step]:
        o = self.options
        return Call(
            self.scripts.audit_schedules,
            [self.keys.schedules(shard)],
            [cursor, o.batch, clock_arg(o.now_ms), o.overdue_ms],
            _step2(shard),
        )

    # -- repairs -------------------------------------------------------------------------

    def repair_wheel(self, shard: int, run_id: str, attempt: str) -> Call[tuple[int, str]]:
        s = self.store.settings
        return Call(
            self.scripts.repair_wheel,
            [self.keys.meta(shard)],
            [
                run_id,
                attempt,
                s.bucket_ms,
                clock_arg(self.options.now_ms),
                self.keys.wake_channel(),
                shard,
            ],
            _code,
        )

    def repair_retry(self, shard: int, run_id: str, attempt: str) -> Call[tuple[int, str]]:
        s = self.store.settings
        return Call(
            self.scripts.repair_retry,
            [self.keys.meta(shard), self.keys.events(shard)],
            [
                run_id,
                attempt,
                s.retry_defaults_json(),
                repr(random.random()),
                *self.store.shared(shard, self.options.now_ms),
            ],
            _code,
        )

    def repair_pending(
        self, stream: str, group: str, entry_id: str, run_id: str, attempt: str
    ) -> Call[tuple[int, str]]:
        s = self.store.settings
        return Call(
            self.scripts.repair_pending,
            [stream],
            [
                group,
                entry_id,
                run_id,
                attempt,
                s.visibility_timeout_ms,
                s.min_visibility_timeout_ms,
                REAPER_CONSUMER,
                s.bucket_ms,
            ],
            _code,
        )

    def repair_plan(self, shard: int, sid: str) -> Call[tuple[int, str]]:
        return Call(self.scripts.repair_plan, [self.keys.schedule(shard, sid)], [sid], _code)

    def repair_usage(
        self, shard: int, tenant: str, field: str, expected: str, read: str, since: str
    ) -> Call[tuple[int, str]]:
        """Set `field` of the tenant's usage hash to `expected` if it still holds `read`
        ('' = missing) and no event after `since` names the tenant."""
        return Call(
            self.scripts.repair_usage,
            [self.keys.usage(shard, tenant), self.keys.events(shard)],
            [tenant, field, expected, read, since, REPAIR_USAGE_EVENTS_READ],
            _code,
        )
