"""The continuous auditor: a duty of the scheduler nodes, one node at a time.

The node that holds the auditor lease (keys auditor_lease/auditor_meta, the scripts of a
shard lease with its fencing epoch, timewheel/dispatch/leases.py DutyLease) audits the
deployment a step at a time (`AuditPass.step(audit_step_budget)`), spreading the steps
so that a pass takes about 3/4 of `audit_interval_ms`, and starts a pass every interval.
Whatever a pass costs, each step is followed by a pause long enough that the steps take
at most `audit_max_share` of the time (share_pause): a deployment too large for its
interval gets slower passes, never a busier Redis.
A node that stops releases the lease, and the next lease round of another node takes it
(one that dies: once its ttl ran out).

After each pass it exports the pass as metrics (timewheel_audit_findings{kind}, per tenant
the TOP_TENANTS with the most findings and 'other', the pass's end time; the archiver's
lag and last commit, the dead letters per tenant, the shards without a live owner),
logs the first LOG_FINDINGS findings with their ids, and stores the pass, bounded, as
JSON in audit_latest (lua/audit_publish.lua, fenced by the epoch), which GET /v1/audit
answers from. It also runs the canaries (canary.py), whose findings join every pass and
whose metrics change as canaries come back or miss their deadline.

With an archive (postgres_dsn) a pass ends with the archive's open runs against Redis,
the archiver's progress (archived.py) and each tenant's open runs as the archive and
Redis count them (counts.py, count_mismatch), the last in steps of the same budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import structlog
from redis.exceptions import RedisError

from timewheel.audit.archived import ArchiveCheck, archiver_views
from timewheel.audit.calls import AuditOptions
from timewheel.audit.canary import Canaries
from timewheel.audit.counts import CountCheck
from timewheel.audit.findings import Finding, Kind, Tally
from timewheel.audit.passes import AuditPass, AuditReport
from timewheel.dispatch.leases import DutyLease
from timewheel.dispatch.metrics import INTERNAL_TENANT, AuditorMetrics, top_tenants
from timewheel.errors import LeaseLost, RedisUnavailable, TimewheelError
from timewheel.store.library import check
from timewheel.store.shard import Call, Store
from timewheel.types import ms_to_rfc3339

log = structlog.get_logger("timewheel.auditor")

KEEP = 1000
"""Findings a pass keeps in memory (the rest are counted)."""
STORED_FINDINGS = 200
"""Findings stored with the latest pass (the first ones found)."""
STORED_TENANTS = 1000
"""Tenants whose counts are stored with the latest pass (the most findings first)."""
DETAIL_CHARS = 300
"""A stored finding's detail is cut to this many characters."""
LOG_FINDINGS = 20
"""Findings logged one by one per pass; the rest are counted in one line."""
ARCHIVE_RUNS = 5000
"""Open runs of the archive a pass checks against Redis (archived.py), each pass going on
where the last stopped."""
PACE_SHARE = 0.75
"""The share of the interval a pass's steps are spread over."""
MIN_PAUSE_S, MAX_PAUSE_S = 0.002, 1.0
FIRST_PAUSE_S = 0.05
"""The pause between the steps of a node's first pass, before it knows how many a pass
takes: at most 20 steps a second, about 20,000 things read a second."""
START_DELAY_S = 5.0
"""How long after taking the lease the first pass and the first canaries wait: a node
that has just started takes its shards, catches up on what is due and does what else
starts with it first."""
CANARY_POLL_S = 0.05
"""How often the canary streams are read while canaries are out."""


def share_pause(step_s: float, share: float) -> float:
    """The pause after a step that took `step_s` so that steps take at most `share` of
    the time (a step's wall time: its Redis calls and their wait, so a slow Redis makes
    the auditor slower too)."""
    return max(0.0, step_s) * (1.0 - share) / share


def _published(reply: list[Any]) -> bool:
    return int(check(reply, action="publish the audit pass")[0]) == 1


def stored_pass(
    report: AuditReport, node: str, extra: list[Finding], tally: Tally
) -> dict[str, Any]:
    """The JSON stored as the latest pass, bounded whatever the pass found: counts by
    kind, by tenant and kind (the STORED_TENANTS tenants with the most findings), and the
    first STORED_FINDINGS findings (`extra`, the canaries', first)."""
    counts: Counter[str] = Counter({k.value: n for k, n in report.counts.items()})
    counts.update(f.kind.value for f in extra)
    ranked = top_tenants(dict(tally.by_tenant), STORED_TENANTS)
    tenants: dict[str, dict[str, int]] = {}
    for (tenant, kind), n in sorted(tally.by_tenant_kind.items()):
        if tenant in ranked and tenant != INTERNAL_TENANT:
            tenants.setdefault(tenant, {})[kind.value] = n
    findings = [f for f in [*extra, *report.findings] if f.tenant != INTERNAL_TENANT]
    return {
        "pass_id": report.pass_id,
        "node": node,
        "finished_at": ms_to_rfc3339(report.finished_ms),
        "seconds": round(report.seconds, 3),
        "shards": len(report.shards),
        "examined": report.examined.to_json(),
        "counts": dict(sorted(counts.items())),
        "tenants": tenants,
        "findings": [
            {**f.to_json(), "detail": f.detail[:DETAIL_CHARS]} for f in findings[:STORED_FINDINGS]
        ],
        "truncated": report.truncated or len(findings) > STORED_FINDINGS,
    }


class ContinuousAuditor:
    """The auditor duty of one scheduler node (the lease decides whether it runs)."""

    def __init__(
        self,
        store: Store,
        node: str,
        ttl_ms: int,
        metrics: AuditorMetrics,
        live: Callable[[], list[str]],
    ) -> None:
        self.store = store
        self.settings = store.settings
        self.node = node
        self.metrics = metrics
        self.live = live
        keys = store.keys
        self.lease = DutyLease(store, node, ttl_ms, keys.auditor_lease(), keys.auditor_meta())
        self.round_s = ttl_ms / 4000.0
        self.epoch: int | None = None
        self.canaries: Canaries | None = None
        self.archive = (
            ArchiveCheck(
                store,
                self.settings.postgres_dsn,
                tolerant=True,
                behind_ms=self.settings.audit_archiver_behind_ms,
            )
            if self.settings.postgres_dsn
            else None
        )
        self.counts = (
            CountCheck(store, self.settings.postgres_dsn, window_ms=None, tolerant=True)
            if self.settings.postgres_dsn
            else None
        )
        """Each tenant's open runs, archive against Redis, at the end of every pass."""
        self.current: AuditPass | None = None
        self.passes = 0
        self._next_pass = 0.0
        self._next_canary = 0.0
        self._pause_s = FIRST_PAUSE_S
        self._floor_s = 0.0
        """The pause the last step's own time asks for (share_pause)."""
        self._steps = 0
        self._work_s = 0.0
        """What the current pass's steps took, pauses left out."""
        self._next_step = 0.0
        """When the current pass's next step may run (after its pause)."""
        self._pass_started = 0.0

    @property
    def holding(self) -> bool:
        return self.epoch is not None

    # -- the lease ----------------------------------------------------------------------

    async def _round(self) -> None:
        if self.epoch is None:
            epoch = await self.lease.acquire()
            if epoch is not None:
                self.epoch = epoch
                self.metrics.clear()
                self.metrics.active = True
                self.canaries = Canaries(self.store, self.node, self.metrics)
                self._next_pass = self._next_canary = time.monotonic() + START_DELAY_S
                log.info("auditor_lease_acquired", node=self.node, epoch=epoch)
        elif not await self.lease.renew(self.epoch):
            self._lost("lease_lost")

    def _lost(self, reason: str) -> None:
        log.info("auditor_lease_dropped", node=self.node, epoch=self.epoch, reason=reason)
        self.epoch = None
        self.current = None
        self.canaries = None
        self.metrics.clear()

    # -- passes -------------------------------------------------------------------------

    def _options(self) -> AuditOptions:
        return AuditOptions(events=True)

    async def _step(self) -> None:
        now = time.monotonic()
        if self.current is not None and now < self._next_step:
            return  # woken early (canaries, the lease round): the pause still holds
        if self.current is None:
            if now < self._next_pass:
                return
            self.current = AuditPass(
                self.store,
                self._options(),
                keep=KEEP,
                live=self.live(),
                archive=self.archive,
                archive_limit=ARCHIVE_RUNS,
                counts=self.counts,
            )
            self._pass_started = now
            self._next_pass = now + self.settings.audit_interval_ms / 1000.0
            self._steps = 0
            self._work_s = 0.0
        audit = self.current
        self._steps += 1
        began = time.monotonic()
        done = await audit.step(self.settings.audit_step_budget)
        took = time.monotonic() - began
        self._work_s += took
        self._floor_s = share_pause(took, self.settings.audit_max_share)
        self._next_step = began + took + max(self._pause_s, self._floor_s)
        if done:
            self.current = None
            await self._finish(audit)

    async def _finish(self, audit: AuditPass) -> None:
        report = audit.report()
        interval_s = self.settings.audit_interval_ms / 1000.0
        took = time.monotonic() - self._pass_started
        if took > interval_s:
            log.warning("audit_pass_slow", seconds=round(took, 3), interval_s=interval_s)
        # The next pass's steps are spread over PACE_SHARE of the interval (from this
        # pass's step count; what the steps themselves took is subtracted).
        spare = interval_s * PACE_SHARE - self._work_s
        self._pause_s = min(MAX_PAUSE_S, max(MIN_PAUSE_S, spare / max(1, self._steps)))
        extra = self.canaries.check() if self.canaries is not None else []
        self.passes += 1
        m = self.metrics
        counts = {k.value: report.counts.get(k, 0) for k in Kind}
        for f in extra:
            counts[f.kind.value] += 1
        m.findings = counts
        tenants = {t: n for t, n in audit.tally.by_tenant.items() if t != INTERNAL_TENANT}
        m.tenant_findings = top_tenants(tenants)
        m.last_pass_s = report.finished_ms / 1000.0
        m.unowned = report.counts.get(Kind.SHARD_UNOWNED, 0)
        await self._measure(audit)
        self._log(report, extra)
        await self._publish(report, audit, extra)

    async def _measure(self, audit: AuditPass) -> None:
        """Archiver lag and last commit (the pass's archiver_behind check read them, with
        an archive), dead letters per tenant."""
        try:
            fresh = self.archive is not None and self.archive.behind_ms is not None
            views = self.archive.views if fresh and self.archive else []
            if not views:
                views = await archiver_views(self.store)
            dead_names = audit.discovery.dead
            pipe = self.store.client.pipeline(transaction=False)
            for name in dead_names:
                pipe.xlen(name)
            lengths: list[Any] = await pipe.execute() if dead_names else []
        except (RedisError, OSError, TimewheelError) as exc:
            log.warning("audit_measure_failed", error=str(exc))
            return
        marked = [v for v in views if v.mark]
        if marked:
            self.metrics.archiver_lag = sum(v.behind for v in marked)
            times = [v.at_ms for v in marked if v.at_ms is not None]
            self.metrics.archiver_commit_s = max(times) / 1000.0 if times else None
        dead: Counter[str] = Counter()
        for name, n in zip(dead_names, lengths, strict=True):
            tenant = name.split("}:dead:", 1)[1]
            if tenant != INTERNAL_TENANT and int(n):
                dead[tenant] += int(n)
        self.metrics.dead_letters = top_tenants(dict(dead))

    def _log(self, report: AuditReport, extra: list[Finding]) -> None:
        shown = [*extra, *report.findings]
        for f in shown[:LOG_FINDINGS]:
            log.warning(
                "audit_finding",
                pass_id=report.pass_id,
                kind=f.kind.value,
                shard=f.shard,
                tenant=f.tenant or None,
                id=f.id or None,
                reason=f.reason or None,
                detail=f.detail[:DETAIL_CHARS],
            )
        rest = report.total + len(extra) - min(len(shown), LOG_FINDINGS)
        if rest > 0:
            log.warning("audit_findings_not_logged", pass_id=report.pass_id, count=rest)

    async def _publish(self, report: AuditReport, audit: AuditPass, extra: list[Finding]) -> None:
        if self.epoch is None:
            return
        doc = stored_pass(report, self.node, extra, audit.tally)
        k = self.store.keys
        call = Call(
            self.store.scripts.audit_publish,
            [k.auditor_lease(), k.audit_latest()],
            [self.node, self.epoch, json.dumps(doc, separators=(",", ":"))],
            _published,
        )
        try:
            await self.store.run(call)
        except LeaseLost:
            self._lost("lease_lost")
        except TimewheelError as exc:
            log.warning("audit_publish_failed", error=str(exc))

    # -- the loop -------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Take part in the duty until `stop` is set; then give the lease up."""
        next_round = 0.0
        try:
            while not stop.is_set():
                now = time.monotonic()
                if now >= next_round:
                    next_round = now + self.round_s
                    try:
                        await self._round()
                    except TimewheelError as exc:
                        log.warning("auditor_round_failed", error=str(exc), node=self.node)
                wait_s = next_round - time.monotonic()
                if self.holding:
                    try:
                        await self._duty()
                    except (TimewheelError, RedisUnavailable) as exc:
                        log.warning("audit_step_failed", error=str(exc), node=self.node)
                        self.current = None  # begin again with a fresh pass
                        wait_s = min(wait_s, 1.0)
                    wait_s = min(wait_s, self._wait_s())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(0.0, wait_s))
        finally:
            if self.epoch is not None:
                with contextlib.suppress(TimewheelError):
                    await self.lease.release(self.epoch)
                self._lost("shutdown")

    async def _duty(self) -> None:
        now = time.monotonic()
        canaries = self.canaries
        if canaries is not None and self.settings.canary_interval_ms > 0:
            send = now >= self._next_canary
            if send:
                self._next_canary = now + self.settings.canary_interval_ms / 1000.0
            found = await canaries.step(send)
            self.metrics.findings[Kind.CANARY_MISSING.value] = len(found)
        await self._step()

    def _wait_s(self) -> float:
        now = time.monotonic()
        waits = [self._next_step - now if self.current is not None else self._next_pass - now]
        if self.canaries is not None and self.settings.canary_interval_ms > 0:
            waits.append(self._next_canary - now)
            if self.canaries.waiting:
                waits.append(CANARY_POLL_S)
        return max(0.0, min(waits))
