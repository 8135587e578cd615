"""Prometheus metrics of a scheduler node, in a registry of its own (no global state)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from timewheel.models import LAG_BUCKETS_MS, TickResult


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
        cumulative, buckets = 0, []
        for bound, n in zip([*LAG_BUCKETS_MS, None], self.counts, strict=True):
            cumulative += n
            buckets.append(("+Inf" if bound is None else repr(bound / 1000), cumulative))
        family.add_metric([], buckets, self.sum_ms / 1000)
        yield family


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
        self.clock_offset = Gauge(
            "timewheel_clock_offset_seconds",
            "Redis's clock minus this node's wall clock, at the last reply carrying it "
            "(reported only: every timer runs on Redis's clock).",
            registry=r,
        )

    def observe_tick(self, res: TickResult, seconds: float) -> None:
        self.tick_seconds.observe(seconds)
        for tenant, count in res.per_tenant.items():
            self.dispatched.labels(tenant).inc(count)
        self.lag.add(res.lag_counts, res.lag_sum_ms)
        self.backlog.labels(str(res.shard)).set(res.backlog)
        self.rate_held.labels(str(res.shard)).set(sum(res.held.values()))
