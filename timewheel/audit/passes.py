"""An audit pass over a deployment's shards: the key names first, then shard by shard,
in bounded steps.

`AuditPass.step(budget)` does about `budget` things' worth of calls (records, entries,
members, schedules, key names read) and keeps every cursor, so a scheduler node can run a
pass within a CPU budget, a little per turn; `run()` goes to the end. Memory is bounded by
the key names of the near levels, far buckets and ready streams of the shards not yet
audited (keyspace.py) and the findings kept (`keep`); findings past that are only
counted. Nothing is held per run.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import structlog

from timewheel.audit.archived import ArchiveCheck
from timewheel.audit.calls import AuditCalls, AuditOptions
from timewheel.audit.counts import CountCheck, TenantCounts
from timewheel.audit.findings import Finding, Kind, Tally
from timewheel.audit.keyspace import SCAN_COUNT, KeyDiscovery
from timewheel.audit.repair import Repairer
from timewheel.audit.shard import Examined, ShardAudit
from timewheel.store.shard import Store

log = structlog.get_logger("timewheel.audit")


@dataclass(frozen=True, slots=True)
class AuditReport:
    """What a pass found and read."""

    pass_id: str
    shards: list[int]
    seconds: float
    finished_ms: int
    """When the pass ended, wall clock (the future last-pass timestamp)."""
    examined: Examined
    counts: dict[Kind, int]
    reasons: dict[Kind, dict[str, int]]
    findings: list[Finding]
    """The first `keep` findings."""
    truncated: bool
    repairs: dict[Kind, dict[str, int]] = field(default_factory=dict)
    """kind -> {'repaired': n, 'unchanged': n}, with --repair."""
    tenants: list[TenantCounts] = field(default_factory=list)
    """Each tenant's counts, archive against Redis, with --counts (audit/counts.py)."""

    @property
    def clean(self) -> bool:
        return not self.counts

    @property
    def total(self) -> int:
        return sum(self.counts.values())


class AuditPass:
    """One pass over `shards` (default: all of them)."""

    def __init__(
        self,
        store: Store,
        options: AuditOptions | None = None,
        *,
        shards: Iterable[int] | None = None,
        repair: bool = False,
        keep: int = 1000,
        live: Iterable[str] | None = None,
        archive: ArchiveCheck | None = None,
        archive_limit: int | None = None,
        counts: CountCheck | None = None,
    ) -> None:
        self.store = store
        self.options = options or AuditOptions()
        self.calls = AuditCalls(store, self.options)
        self.pass_id = secrets.token_hex(6)
        self.shards = list(range(store.settings.shards) if shards is None else shards)
        self.tally = Tally(keep)
        self.repairer = Repairer(self.calls) if repair else None
        self.examined = Examined()
        self.discovery = KeyDiscovery(store, self.shards)
        self.live = None if live is None else frozenset(live)
        self.archive = archive
        """The archive against Redis once the shards are done, up to `archive_limit` open
        runs (None: all)."""
        self.archive_limit = archive_limit
        self.counts = counts
        """Per-tenant counts, archive against Redis, once the shards are done."""
        self._archived = False
        """Whether the archive's step after the shards was taken (_tail)."""
        self._waiting = deque(self.shards)
        self._current: ShardAudit | None = None
        self._started = time.monotonic()
        self._seconds: float | None = None

    @property
    def done(self) -> bool:
        return self._seconds is not None

    async def _found(self, finding: Finding) -> None:
        self.tally.add(finding)
        if self.repairer is not None:
            await self.repairer.repair(finding)

    def _audit(self, shard: int) -> ShardAudit:
        keys = self.discovery.take(shard)
        return ShardAudit(self.calls, shard, self.pass_id, keys, self._found, self.live)

    def _finished(self, audit: ShardAudit) -> None:
        self.examined.add(audit.examined)

    async def step(self, budget: int) -> bool:
        """Audit on for about `budget` things read; True once the pass is done."""
        while budget > 0 and not self.discovery.done:
            # A SCAN step looks at SCAN_COUNT keys, whatever few of them it returns.
            await self.discovery.step()
            budget -= SCAN_COUNT
            self.examined.calls += 1
        while budget > 0 and not self.done:
            if self._current is None:
                if not self._waiting:
                    budget -= await self._tail(budget)
                    continue
                self._current = self._audit(self._waiting.popleft())
            budget -= await self._current.step(budget)
            if self._current.done:
                self._finished(self._current)
                self._current = None
        return self.done

    async def run(self, parallel: int = 1) -> AuditReport:
        """Audit every shard left, `parallel` shards at a time (on a Cluster, shards of
        different primaries are read at once); the report."""
        while not self.discovery.done:
            await self.discovery.step()
            self.examined.calls += 1
        if self._current is not None:
            await self._current.run()
            self._finished(self._current)
            self._current = None

        async def worker() -> None:
            while self._waiting:
                audit = self._audit(self._waiting.popleft())
                await audit.run()
                self._finished(audit)

        await asyncio.gather(*(worker() for _ in range(max(1, parallel))))
        while not self.done:
            await self._tail(1 << 30)
        return self.report()

    async def _tail(self, budget: int) -> int:
        """The checks after the shards, a step at a time: the archive's open runs and the
        archiver's checkpoints (one step), then the counts per tenant (steps of about
        `budget`); the pass ends after them. Returns what the step read."""
        if self.done:
            return 0
        if not self._archived:
            self._archived = True
            read = 0
            if self.archive is not None:
                before = self.archive.checked
                for finding in await self.archive.check(self.archive_limit):
                    await self._found(finding)
                self.examined.archived += self.archive.checked - before
                for finding in await self.archive.behind():
                    await self._found(finding)
                read = self.archive.checked - before + self.store.settings.shards
            if self.counts is not None:
                self.counts.begin()
            return max(1, read)
        if self.counts is not None and not self.counts.done:
            read, findings = await self.counts.step(budget)
            for finding in findings:
                await self._found(finding)
            return max(1, read)
        self._end()
        return 0

    def _end(self) -> None:
        if self._seconds is None:
            self.examined.keys = self.discovery.scanned
            self._seconds = time.monotonic() - self._started
            self._log()

    def report(self) -> AuditReport:
        t = self.tally
        reasons: dict[Kind, dict[str, int]] = {}
        for (kind, reason), n in sorted(t.by_reason.items()):
            reasons.setdefault(kind, {})[reason] = n
        repairs: dict[Kind, dict[str, int]] = {}
        if self.repairer is not None:
            for (kind, outcome), n in sorted(self.repairer.outcomes.items()):
                repairs.setdefault(kind, {})[outcome] = n
        seconds = self._seconds if self._seconds is not None else time.monotonic() - self._started
        return AuditReport(
            pass_id=self.pass_id,
            shards=list(self.shards),
            seconds=seconds,
            finished_ms=int(time.time() * 1000),
            examined=self.examined,
            counts={kind: t.by_kind[kind] for kind in Kind if t.by_kind[kind]},
            reasons=reasons,
            findings=list(t.kept),
            truncated=t.truncated,
            repairs=repairs,
            tenants=list(self.counts.tenants) if self.counts is not None else [],
        )

    def _log(self) -> None:
        """A line per kind found, then one for the pass."""
        t = self.tally
        for kind in Kind:
            if t.by_kind[kind]:
                log.warning(
                    "audit_findings",
                    kind=kind.value,
                    count=t.by_kind[kind],
                    shards=sorted(t.shards[kind]),
                    reasons={r: n for (k, r), n in sorted(t.by_reason.items()) if k is kind},
                )
        log.info(
            "audit_pass",
            pass_id=self.pass_id,
            shards=len(self.shards),
            findings=t.total,
            seconds=round(self._seconds or 0.0, 3),
            **self.examined.to_json(),
        )
