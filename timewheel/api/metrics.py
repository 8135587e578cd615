"""The API process's own Prometheus metrics, in a registry per app (no global state)."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


class ApiMetrics:
    """Requests by method, route template and status; latency by route. Labels carry no
    tenant, so /metrics (unauthenticated, like /healthz) shows no tenant's name or count."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        self.requests = Counter(
            "timewheel_api_requests",
            "HTTP requests answered, by method, route template and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "timewheel_api_request_seconds",
            "Time from routing to response, by method and route template.",
            ["method", "route"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )

        self.storage_used = Gauge(
            "timewheel_storage_used_ratio",
            "The fullest Redis primary's memory in use over its storage guard ceiling "
            "(maxmemory, or storage_max_bytes if lower); creates stop at "
            "storage_guard_ratio. NaN when no node has a ceiling.",
            registry=self.registry,
        )
        self.clock_offset = Gauge(
            "timewheel_clock_offset_seconds",
            "Redis's clock minus this node's wall clock, as of the last TIME read (reported "
            "only: schedules are anchored on Redis's clock).",
            registry=self.registry,
        )

        self.unreplicated_writes = Counter(
            "timewheel_unreplicated_writes",
            "Writes answered without a replica's confirmation: their primary had no "
            "replica attached (min_replicas_ack -1, after a failover or a replica's death).",
            registry=self.registry,
        )
        self.unreplicated_seen = 0
        """The store's count of such writes at the last scrape."""

        self._children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}
        """The labelled series of each (method, route, status) seen, looked up once."""

    def observe(self, method: str, route: str, status: int, started: float) -> None:
        series = self._children.get((method, route, status))
        if series is None:
            series = (
                self.requests.labels(method, route, str(status)),
                self.latency.labels(method, route),
            )
            self._children[(method, route, status)] = series
        series[0].inc()
        series[1].observe(time.perf_counter() - started)
