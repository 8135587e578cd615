"""The safe repairs of `timewheel audit --repair`: each puts back what a finding shows
missing, through the same helpers the operations use, and deletes nothing.

- not_in_wheel, due_index: lua/repair_wheel.lua places the run with wheel_place, as
  create does (its level, the wheel index, the due index).
- dispatched_without_entry: lua/repair_retry.lua sends the run through retry_or_bury, as
  the reaper sends a run whose executor lease expired (reason delivery_lost).
- delivered_not_pending: lua/repair_pending.lua puts the entry back in its group's
  pending list, idle for its visibility timeout, so the reaper's next pass retries it.
- group_unwatched: the group goes into the shard's groups set, as a worker adds it.
- schedule_unindexed: lua/repair_plan.lua puts the schedule back in its plan index.
- usage_mismatch: lua/repair_usage.lua sets the usage field to what the records gave,
  if it still holds what the audit read and no event since the records phase began
  names the tenant ('busy' when too many events came to tell).

Every call checks, in Redis, that the run, schedule or count is still as the audit found
it, and does nothing otherwise. Each repair is logged (`audit_repair`).
"""

from __future__ import annotations

from collections import Counter

import structlog
from redis.exceptions import RedisError

from timewheel.audit.calls import AuditCalls
from timewheel.audit.findings import REPAIRS, Finding, Kind
from timewheel.errors import RedisUnavailable

log = structlog.get_logger("timewheel.audit")

BUSY = "busy"
"""repair_usage's refusal when it cannot tell whether the tenant moved."""


class Repairer:
    """Repairs the findings of a pass as they come."""

    def __init__(self, calls: AuditCalls):
        self.calls = calls
        self.store = calls.store
        self.outcomes: Counter[tuple[Kind, str]] = Counter()
        """(kind, outcome) -> repairs: 'repaired', 'unchanged' (it had moved on), or 'busy'
        (usage_mismatch: too many events since the audit read to tell whether it moved)."""

    @staticmethod
    def repairable(finding: Finding) -> bool:
        return finding.kind in REPAIRS

    async def repair(self, finding: Finding) -> bool | None:
        """Repair one finding: True if repaired, False if there was nothing to do any
        more (the run moved on meanwhile), None for a kind that is not repaired."""
        if finding.kind not in REPAIRS:
            return None
        done, note = await self._repair(finding)
        outcome = "repaired" if done else "busy" if note == BUSY else "unchanged"
        self.outcomes[(finding.kind, outcome)] += 1
        log.info(
            "audit_repair",
            kind=finding.kind.value,
            shard=finding.shard,
            tenant=finding.tenant,
            id=finding.id,
            action=REPAIRS[finding.kind],
            outcome=outcome,
            note=note,
        )
        return done

    async def _repair(self, f: Finding) -> tuple[bool, str]:
        c, run = self.calls, self.store.run
        if f.kind in (Kind.NOT_IN_WHEEL, Kind.DUE_INDEX):
            code, why = await run(c.repair_wheel(f.shard, f.id, f.data))
            return code == 1, why
        if f.kind is Kind.DISPATCHED_WITHOUT_ENTRY:
            code, detail = await run(c.repair_retry(f.shard, f.id, f.data))
            if code == 1:
                return True, f"due again at {detail}"
            if code == 2:
                return True, f"dead-lettered: attempts used up ({detail})"
            return False, "no longer out at that attempt"
        if f.kind is Kind.DELIVERED_NOT_PENDING:
            group, entry_id, attempt, stream = f.data.split("|", 3)
            code, _ = await run(c.repair_pending(stream, group, entry_id, f.id, attempt))
            return code == 1, f"group {group}, entry {entry_id}"
        if f.kind is Kind.GROUP_UNWATCHED:
            member = f"{f.data}|{f.id}"
            try:
                added = await self.store.client.sadd(self.store.keys.groups(f.shard), member)
            except (RedisError, OSError) as exc:
                raise RedisUnavailable(f"cannot add {member} to the groups set: {exc}") from exc
            return bool(added), member
        if f.kind is Kind.USAGE_MISMATCH:
            field, expected, read, since = f.data.split("|", 3)
            code, why = await run(c.repair_usage(f.shard, f.tenant, field, expected, read, since))
            if code == 1:
                return True, f"{field} set to {expected} (was {read or 'missing'})"
            return False, why
        code, _ = await run(c.repair_plan(f.shard, f.id))
        return code == 1, ""
