"""Prometheus metrics of a worker process, in a registry of its own (no global state).

A worker counts every run, so the counting is plain Python integers kept per (tenant,
queue) pair and turned into metric families only when scraped: a `prometheus_client`
Counter or Histogram takes a lock per observation, which at tens of thousands of runs a
second would cost a worker more than the rest of its bookkeeping.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

DURATION_BUCKETS_S = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)
"""Buckets of timewheel_worker_handler_duration_seconds."""
LAG_BUCKETS_S = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0)
"""Buckets of timewheel_worker_start_lag_seconds: those of the dispatch lag."""


class Buckets:
    """The counts of one histogram: `observe` is a bisect and two additions."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def samples(self) -> tuple[list[tuple[str, float]], float]:
        """Cumulative (le, count) buckets and the sum, as HistogramMetricFamily takes them."""
        cumulative, out = 0, list[tuple[str, float]]()
        for bound, n in zip([*self.bounds, None], self.counts, strict=True):
            cumulative += n
            out.append(("+Inf" if bound is None else repr(bound), cumulative))
        return out, self.total


class PairStats:
    """What a worker counts for one (tenant, queue) pair."""

    __slots__ = (
        "acked",
        "dead",
        "duration",
        "failed",
        "handled",
        "lag",
        "queue",
        "retried",
        "stale",
        "tenant",
        "unrecorded",
    )

    def __init__(self, tenant: str, queue: str) -> None:
        self.tenant = tenant
        self.queue = queue
        self.handled = 0
        """Handler calls that finished, returning or raising."""
        self.failed = 0
        """Handler calls that raised (a failed attempt)."""
        self.acked = 0
        """Acks Redis recorded."""
        self.retried = 0
        """Failed attempts that went back into the wheel."""
        self.dead = 0
        """Failed attempts that became dead letters."""
        self.stale = 0
        """Outcomes for an attempt the run had moved past (Redis changed nothing)."""
        self.unrecorded = 0
        """Outcomes Redis did not take: the reaper retries those runs after their lease."""
        self.duration = Buckets(DURATION_BUCKETS_S)
        self.lag = Buckets(LAG_BUCKETS_S)


_COUNTERS = (
    ("handled", "timewheel_worker_handled_runs", "Handler calls that returned or raised."),
    ("failed", "timewheel_worker_failed_runs", "Handler calls that raised: failed attempts."),
    ("acked", "timewheel_worker_acked_runs", "Runs acknowledged (state succeeded)."),
    ("retried", "timewheel_worker_retried_runs", "Failed attempts put back for a later attempt."),
    ("dead", "timewheel_worker_dead_runs", "Failed attempts that became dead letters."),
    (
        "stale",
        "timewheel_worker_stale_outcomes",
        "Acks and fails of an attempt the run had moved past (they changed nothing).",
    ),
    (
        "unrecorded",
        "timewheel_worker_unrecorded_outcomes",
        "Outcomes Redis did not take; the reaper retries those runs after their lease.",
    ),
)


class WorkerMetrics(Collector):
    """A worker's metrics: counters and histograms per (tenant, queue), and gauges read at
    scrape time from the worker (`gauges`, set by the worker that uses these metrics)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.pairs: dict[tuple[str, str], PairStats] = {}
        self.gauges: Callable[[], dict[str, float]] = dict
        """Name -> value of the gauges (running handlers, read-ahead, acks waiting ...)."""
        self.pair_gauges: Callable[[], list[tuple[str, str, int, int, int]]] = list
        """(tenant, queue, runs given to the handler slots, runs held back, share of the
        slots) of every pair served (_PAIR_GAUGES), set by the worker."""
        self.registry.register(self)

    def pair(self, tenant: str, queue: str) -> PairStats:
        """The stats of a pair, made on first use."""
        stats = self.pairs.get((tenant, queue))
        if stats is None:
            stats = self.pairs[(tenant, queue)] = PairStats(tenant, queue)
        return stats

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily]:
        pairs = list(self.pairs.values())
        labels = ["tenant", "queue"]
        for attr, name, text in _COUNTERS:
            counter = CounterMetricFamily(name, text, labels=labels)
            for p in pairs:
                counter.add_metric([p.tenant, p.queue], getattr(p, attr))
            yield counter
        duration = HistogramMetricFamily(
            "timewheel_worker_handler_duration_seconds",
            "Time from a handler's start to its return or raise.",
            labels=labels,
        )
        lag = HistogramMetricFamily(
            "timewheel_worker_start_lag_seconds",
            "Handler start minus the run's due time, on Redis's clock as this process "
            "estimates it (never before the run's dispatched_ms).",
            labels=labels,
        )
        for p in pairs:
            buckets, total = p.duration.samples()
            duration.add_metric([p.tenant, p.queue], buckets, total)
            buckets, total = p.lag.samples()
            lag.add_metric([p.tenant, p.queue], buckets, total)
        yield duration
        yield lag
        rows = self.pair_gauges()
        for column, (name, text) in enumerate(_PAIR_GAUGES):
            gauge = GaugeMetricFamily(name, text, labels=labels)
            for tenant, queue, *values in rows:
                gauge.add_metric([tenant, queue], values[column])
            yield gauge
        for name, value in self.gauges().items():
            yield GaugeMetricFamily(name, _GAUGE_HELP.get(name, name), value=value)


_PAIR_GAUGES = (
    (
        "timewheel_worker_pair_active_runs",
        "Runs of the pair given to the handler slots and not finished (waiting for a "
        "slot, or running).",
    ),
    (
        "timewheel_worker_pair_held_runs",
        "Runs of the pair read and held back: it uses its share of the slots already "
        "while other pairs have work.",
    ),
    (
        "timewheel_worker_pair_slot_share",
        "Handler slots the pair may use while other pairs have work (0: no share).",
    ),
)

_GAUGE_HELP = {
    "timewheel_worker_running_handlers": "Handlers running now.",
    "timewheel_worker_read_ahead_runs": "Runs read and waiting for a free handler slot.",
    "timewheel_worker_unacked_runs": "Runs handled whose ack is not recorded yet.",
    "timewheel_worker_concurrency": "Handlers this process runs at once at most.",
    "timewheel_worker_prefetch": "Runs it may read ahead beyond free handler slots, now.",
    "timewheel_clock_offset_seconds": "Redis's clock minus this node's wall clock, at the "
    "last reply carrying it (reported only).",
}
