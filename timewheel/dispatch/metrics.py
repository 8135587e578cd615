"""Prometheus metrics of a scheduler node, in a registry of its own (no global state)."""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from timewheel.models import LAG_BUCKETS_MS, TickResult

TOP_TENANTS = 20
"""Tenants that get a label of their own in a per-tenant metric of a scheduler node; the
rest are added up under OTHER, so a deployment's tenant count never sets the number of
series (docs/operations/metrics.md, Cardinality)."""
OTHER = "other"
RANK_EVERY_S = 60.0
"""How often TenantLagHistogram ranks the tenants again by the runs of the last period."""
INTERNAL_TENANT = "~canary"
"""The reserved tenant of the canaries (timewheel/audit/canary.py): a name no user tenant
can have ('~' is outside A-Z a-z 0-9 _ . -), left out of every per-tenant metric."""


def top_tenants(counts: dict[str, int], n: int = TOP_TENANTS) -> dict[str, int]:
    """Counts per tenant with at most `n` tenants by name, the largest counts (ties by
    name), and the rest added up under OTHER (when there is a rest)."""
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    out = dict(ranked[:n])
    rest = sum(v for _, v in ranked[n:])
    if len(ranked) > n:
        out[OTHER] = out.get(OTHER, 0) + rest
    return out


def _buckets(counts: list[int], sum_ms: float) -> tuple[list[tuple[str, float]], float]:
    cumulative: float = 0
    buckets: list[tuple[str, float]] = []
    for bound, n in zip([*LAG_BUCKETS_MS, None], counts, strict=True):
        cumulative += n
        buckets.append(("+Inf" if bound is None else repr(bound / 1000), cumulative))
    return buckets, sum_ms / 1000


class LagHistogram(Collector):
    """timewheel_dispatch_lag_seconds, from the bucket counts each tick reply carries.

    The tick counts its runs' lags into LAG_BUCKETS_MS inside Redis, so a node adds
    a few numbers per tick instead of observing every run (about 1 us each in Python).
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.counts = [0] * (len(LAG_BUCKETS_MS) + 1)
        self.sum_ms = 0
        registry.register(self)

    def add(self, counts: list[int], sum_ms: int) -> None:
        for i, n in enumerate(counts[: len(self.counts)]):
            self.counts[i] += n
        self.sum_ms += sum_ms

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(
            "timewheel_dispatch_lag_seconds", "dispatched_ms - due_ms of each dispatched run."
        )
        buckets, sum_s = _buckets(self.counts, self.sum_ms)
        family.add_metric([], buckets, sum_s)
        yield family


class TenantLagHistogram(Collector):
    """timewheel_tenant_dispatch_lag_seconds{tenant}: dispatch lag per tenant, for the
    TOP_TENANTS busiest tenants by name and OTHER for the rest.

    From the tick's reply: per tenant its runs dispatched and their lags added up. The
    sum and the count are exact; each tick's runs of one tenant fall into the bucket of
    their mean lag (a tick sends what was due within a few ms, so their lags are close).

    Cardinality: a tenant gets its own series while it is among the TOP_TENANTS tenants
    with the most runs dispatched by this node in the last RANK_EVERY_S (until the first
    ranking: the first TOP_TENANTS tenants seen). Runs of other tenants go into OTHER. A
    tenant that leaves the top loses its series and one that enters starts a new one, so
    every series only grows while it exists and there are never more than TOP_TENANTS+1.
    """

    def __init__(self, registry: CollectorRegistry, clock: Callable[[], float] = time.monotonic):
        self.series: dict[str, tuple[list[int], list[float]]] = {}
        """tenant or OTHER -> (bucket counts, [sum_ms])"""
        self.labelled: set[str] = set()
        self.period: dict[str, int] = {}
        """Runs per tenant since the last ranking."""
        self._clock = clock
        self._ranked_at = clock()
        registry.register(self)

    def _rank(self) -> None:
        ranked = sorted(self.period.items(), key=lambda kv: (-kv[1], kv[0]))
        wanted = {t for t, _ in ranked[:TOP_TENANTS]}
        for gone in self.labelled - wanted:
            self.series.pop(gone, None)
        self.labelled = wanted
        self.period = {}

    def add(self, res: TickResult) -> None:
        now = self._clock()
        if now - self._ranked_at >= RANK_EVERY_S:
            self._rank()
            self._ranked_at = now
        for tenant, count in res.per_tenant.items():
            if tenant == INTERNAL_TENANT or count <= 0:
                continue
            self.period[tenant] = self.period.get(tenant, 0) + count
            if tenant not in self.labelled and len(self.labelled) < TOP_TENANTS:
                self.labelled.add(tenant)
            name = tenant if tenant in self.labelled else OTHER
            counts, total = self.series.setdefault(name, ([0] * (len(LAG_BUCKETS_MS) + 1), [0.0]))
            lag_ms = res.tenant_lag_ms.get(tenant, 0)
            counts[bisect.bisect_left(LAG_BUCKETS_MS, lag_ms / count)] += count
            total[0] += lag_ms

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(
            "timewheel_tenant_dispatch_lag_seconds",
            "dispatched_ms - due_ms per tenant (the busiest tenants, the rest as 'other').",
            labels=["tenant"],
        )
        for tenant, (counts, total) in sorted(self.series.items()):
            buckets, sum_s = _buckets(counts, total[0])
            family.add_metric([tenant], buckets, sum_s)
        yield family


class AuditorMetrics(Collector):
    """What the continuous auditor (timewheel/audit/continuous.py) exports, on the node
    that holds its lease only: a node without it exports the families with no sample,
    so an alert's max() reads the auditing node's values alone."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.clear()
        registry.register(self)

    def clear(self) -> None:
        """Forget everything (at start, and when the lease moves to another node)."""
        self.active = False
        self.findings: dict[str, int] = {}
        """kind -> findings of the latest pass (every kind, 0 included)."""
        self.tenant_findings: dict[str, int] = {}
        self.last_pass_s: float | None = None
        self.canary_lag: dict[tuple[str, str], float] = {}
        """(shard, stage) -> seconds, stage dispatched or acked."""
        self.canary_missing: dict[str, int] = {}
        self.archiver_lag: int | None = None
        self.archiver_commit_s: float | None = None
        self.dead_letters: dict[str, int] = {}
        self.unowned: int | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        def gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=labels)

        active = gauge("timewheel_auditor", "1 on the node holding the auditor lease, else 0.")
        active.add_metric([], 1.0 if self.active else 0.0)
        yield active
        f = gauge("timewheel_audit_findings", "Findings of the latest audit pass.", ["kind"])
        for kind, n in sorted(self.findings.items()):
            f.add_metric([kind], n)
        yield f
        t = gauge(
            "timewheel_audit_tenant_findings",
            "Findings of the latest audit pass per tenant (the most, the rest as 'other').",
            ["tenant"],
        )
        for tenant, n in sorted(self.tenant_findings.items()):
            t.add_metric([tenant], n)
        yield t
        last = gauge(
            "timewheel_audit_last_pass_timestamp_seconds", "When the latest audit pass ended."
        )
        if self.last_pass_s is not None:
            last.add_metric([], self.last_pass_s)
        yield last
        lag = gauge(
            "timewheel_canary_lag_seconds",
            "The latest canary of the shard: from its due time to its dispatch or its ack.",
            ["shard", "stage"],
        )
        for (shard, stage), v in sorted(self.canary_lag.items()):
            lag.add_metric([shard, stage], v)
        yield lag
        miss = gauge(
            "timewheel_canary_missing",
            "1 while the shard's canary is past its deadline unacknowledged.",
            ["shard"],
        )
        for shard, v in sorted(self.canary_missing.items(), key=lambda kv: int(kv[0])):
            miss.add_metric([shard], v)
        yield miss
        behind = gauge(
            "timewheel_archiver_lag_entries", "Event-log entries the archiver has not archived."
        )
        if self.archiver_lag is not None:
            behind.add_metric([], self.archiver_lag)
        yield behind
        commit = gauge(
            "timewheel_archiver_last_commit_timestamp_seconds",
            "When the archiver last confirmed its checkpoint (after a commit, or idle).",
        )
        if self.archiver_commit_s is not None:
            commit.add_metric([], self.archiver_commit_s)
        yield commit
        dead = gauge(
            "timewheel_dead_letters",
            "Dead letters held per tenant (the most, the rest as 'other').",
            ["tenant"],
        )
        for tenant, n in sorted(self.dead_letters.items()):
            dead.add_metric([tenant], n)
        yield dead
        unowned = gauge(
            "timewheel_unowned_shards", "Shards no live scheduler node held at the latest pass."
        )
        if self.unowned is not None:
            unowned.add_metric([], self.unowned)
        yield unowned


class SchedulerMetrics:
    """A scheduler node's metrics, updated from each tick's reply (no Redis round trips).

    The lag histogram adds the bucket counts each tick reply carries.
    """

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.dispatched = Counter(
            "timewheel_dispatched_runs", "Runs written to ready streams.", ["tenant"], registry=r
        )
        self.lag = LagHistogram(r)
        self.backlog = Gauge(
            "timewheel_due_backlog",
            "Runs due but not yet dispatched (0 unless a tick hit its limit).",
            ["shard"],
            registry=r,
        )
        self.rate_held = Gauge(
            "timewheel_rate_held_runs",
            "Runs due but held back by their tenants' dispatch_rate, at the shard's last tick.",
            ["shard"],
            registry=r,
        )
        self.parked = Gauge(
            "timewheel_parked_runs",
            "Runs due but parked in the wheel: their ready stream is over its backlog cap, "
            "at the shard's last tick.",
            ["shard"],
            registry=r,
        )
        self.tick_seconds = Histogram(
            "timewheel_tick_duration_seconds",
            "Round trip of one tick call (a pass's pipeline divided by its shards).",
            registry=r,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
        )
        self.lease_acquired = Counter(
            "timewheel_lease_acquisitions", "Shard leases taken by this node.", registry=r
        )
        self.lease_lost = Counter(
            "timewheel_lease_losses", "Shard leases lost or given up.", ["reason"], registry=r
        )
        self.owned = Gauge("timewheel_owned_shards", "Shards this node holds.", registry=r)
        self.shards = Gauge("timewheel_shards", "Shards of the deployment.", registry=r)
        self.tenant_lag = TenantLagHistogram(r)
        self.auditor = AuditorMetrics(r)
        self.clock_offset = Gauge(
            "timewheel_clock_offset_seconds",
            "Redis's clock minus this node's wall clock, at the last reply carrying it "
            "(reported only: every timer runs on Redis's clock).",
            registry=r,
        )

    def observe_tick(self, res: TickResult, seconds: float) -> None:
        self.tick_seconds.observe(seconds)
        for tenant, count in res.per_tenant.items():
            if tenant != INTERNAL_TENANT:
                self.dispatched.labels(tenant).inc(count)
        self.lag.add(res.lag_counts, res.lag_sum_ms)
        if res.per_tenant:
            self.tenant_lag.add(res)
        self.backlog.labels(str(res.shard)).set(res.backlog)
        self.rate_held.labels(str(res.shard)).set(sum(res.held.values()))
        self.parked.labels(str(res.shard)).set(res.parked)
