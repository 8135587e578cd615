"""Settings: one frozen object, read from TIMEWHEEL_* environment variables or built in code."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from timewheel.errors import ConfigError
from timewheel.ids import MAX_SHARDS
from timewheel.store.sentinel import is_sentinel_url, parse_sentinel_url


@dataclass(frozen=True, slots=True)
class Settings:
    """Deployment settings. Layout fields (shards, bucket_ms) are fixed once data exists."""

    redis_url: str = "redis://127.0.0.1:6379"
    """Redis URL: a standalone server (redis://, rediss://, unix://), any node of a
    Cluster (the client finds the others), or a standalone primary under Redis Sentinel,
    `redis+sentinel://[user:password@]host1:port1[,host2:port2,...]/<service>[?db=N]`
    (the sentinels' addresses, port 26379 if left out, and the name they monitor the
    primary under; sentinel_username= and sentinel_password= log in to the sentinels).
    After a failover every connection reconnects to the primary the sentinels name."""
    prefix: str = "tw"
    """Key prefix; every key carries the hash tag {prefix:shard}."""
    shards: int = 64
    """Logical shards, a power of two, fixed when the deployment is created."""
    bucket_ms: int = 600_000
    """Width of a far-level time bucket and of a finished-record expiry bucket. Size it so
    a far bucket holds a few hundred runs per shard (pending runs / shards / buckets in
    their span <= 1024, hash-max-listpack-entries): a bucket past that converts to a
    hashtable (about +60 B/run); one far below it pays the per-key overhead (README,
    Performance). An expiry bucket is a list, compact at any size."""
    horizon_ms: int = 120_000
    """How far ahead of the shard clock the promoter moves buckets into the near level."""
    tick_batch: int = 1000
    """Most runs one tick call dispatches (bounds how long one call blocks Redis)."""
    tick_pipeline_runs: int = 2000
    """Most runs a scheduler expects one pipeline of tick calls to dispatch, by what each
    shard's tick may take (the pass's limit for a shard whose last tick took all it was
    allowed, else what its last tick took); it is also what one pass of a herd shares
    between its shards. Redis runs a pipeline in one go and writes its AOF bytes
    after it: draining a backlog in pipelines of a few thousand runs keeps that buffer
    small and cache-warm (+12% dispatch throughput against one pipeline of 64 shards)
    and lets other clients in every ~25 ms (~40 ms at 3,000). Shards with little due share
    one pipeline."""
    promote_batch: int = 2000
    """Most runs one promote call moves."""
    event_log_max: int = 10_000
    """Approximate cap of each shard's event log stream, in runs named: an entry naming n
    runs (a batched create, a tick, a batch of acks) counts n. Once an archiver has run,
    the log is trimmed only past its checkpoint (see archive_hard_cap and
    lua/lib/events.lua)."""
    retention_ms: int = 86_400_000
    """How long finished task records stay readable (and dedupe idempotent creates)."""
    max_payload_bytes: int = 65_536
    """Largest accepted payload, as encoded JSON text."""
    tenant_max_pending: int = 10_000_000
    """A tenant's most runs not finished at once (scheduled, in flight, waiting for a
    retry), unless its own max_pending says otherwise. 10 M runs with 100-byte payloads
    are about 2 GB of Redis (193 B/task, docs/benchmarks.md): bounded, yet far past a
    tenant's normal backlog."""
    tenant_max_payload_total_bytes: int = 1 << 30
    """A tenant's most payload bytes held at once (runs not finished, dead letters,
    schedules), unless its own limit says otherwise: 1 GiB, 16,384 payloads of the
    largest size, so one tenant cannot fill a Redis of a few GB on its own."""
    tenant_max_schedules: int = 10_000
    """A tenant's most schedules, unless its own limit says otherwise: 10,000
    every-second schedules are what one planner keeps up with on 2 cores."""
    tenant_max_queues: int = 100
    """A tenant's most queues in use at once (a queue with runs not finished or with a
    schedule), unless its own limit says otherwise. Each queue is a ready stream per
    shard, consumer groups and a reaper scan."""
    tenant_max_backlog: int = 1_000_000
    """Most undelivered entries in one ready stream (a tenant's queue in one shard), unless
    the tenant's own max_backlog says otherwise (0: no cap). Past it the tick parks the
    queue's due runs in the wheel instead of sending them. 1 M entries of 100-byte payloads
    are about 250 MB of stream: far past any consumer that keeps up, yet a bound on what a
    queue nobody reads can pile up; the check costs one XLEN per stream per tick call."""
    tenant_min_interval_s: float = 1.0
    """The shortest time between two fire times of a tenant's schedule, unless its own
    limit says otherwise; 1 s refuses nothing (no schedule fires more often)."""
    storage_max_bytes: int = 0
    """A ceiling on each Redis node's memory for the storage guard, bytes (0: none; the
    node's maxmemory is the ceiling then). The lower of the two applies."""
    storage_guard_ratio: float = 0.9
    """Creates (tasks, batches, schedules, triggers, backfills, replays) answer 507
    storage_full while the Redis node that would hold them uses this share of its
    ceiling; dispatch, ack, fail, cancel and delete go on. Redis itself refuses every
    write past maxmemory (noeviction): the rest is what lets the work drain."""
    default_spread: int = 1
    """How many shards a tenant's tasks use unless the tenant says otherwise."""
    poll_cap_ms: int = 250
    """Longest a scheduler sleeps without looking (wake-ups normally come sooner)."""
    sweep_ms: int = 1_000
    """Every shard is ticked at least this often, even with no known due run: a lost
    wake-up message (pub/sub is not durable) delays a run by at most this much."""
    default_queue: str = "default"
    retry_max_attempts: int = 5
    """Attempts before a run is dead-lettered, unless the task says otherwise."""
    retry_initial_ms: int = 1_000
    """Backoff before the second attempt; multiplied by retry_factor per attempt."""
    retry_factor: float = 2.0
    retry_max_ms: int = 3_600_000
    """Cap of one backoff."""
    retry_jitter: str = "full"
    """full (uniform 0..backoff), proportional (backoff x 0.8..1.2) or none."""
    visibility_timeout_ms: int = 30_000
    """How long an executor may hold a run without heartbeat before the reaper retries it."""
    min_visibility_timeout_ms: int = 500
    """Shortest visibility timeout a task may ask for; the reaper ignores younger entries."""
    reap_interval_ms: int = 1_000
    """How often a scheduler node looks for expired executor leases in each shard."""
    min_replicas_ack: int = -1
    """Replicas that must confirm a create, cancel or reschedule (WAIT) before it is
    answered. -1: one, on a primary that has a replica attached; a primary with none (a
    replica promoted after its primary died) answers alone on its AOF, counted in
    timewheel_unreplicated_writes_total. 1 or more: always that many (503 without)."""
    replica_wait_ms: int = 1_000
    """How long a write waits for those replicas before it answers 503."""
    misfire_ms: int = 10_000
    """A schedule's run found later than this (its scheduler was down) is a misfire and
    follows the schedule's catchup policy; a one-shot task is always sent, however late."""
    plan_horizon_ms: int = 30_000
    """How far ahead every active schedule is kept materialized as concrete runs; the
    planner extends a schedule once its next unplanned fire time is within 3/4 of this,
    so a pass adds a quarter of it: a short horizon means small, frequent passes (10,000
    every-1-s schedules keep up at 30 s; at 5 s planning falls behind on 2 cores)."""
    plan_batch: int = 50
    """Most schedules a scheduler node extends between two ticks (keeps planning from
    holding Redis long enough to delay dispatch)."""
    plan_interval_ms: int = 1_000
    """How often a scheduler node runs the planner over each shard it holds."""
    audit_interval_ms: int = 60_000
    """How often the continuous auditor completes a pass over every shard: one scheduler
    node at a time holds its lease and audits a step at a time (0: no continuous audit,
    and no canaries). A pass that needs longer than this starts the next at once."""
    audit_step_budget: int = 1_000
    """Records, entries, members and key names one step of the continuous auditor reads
    at most; steps are spread over the interval, so its share of Redis and of the node's
    CPU is about (what a pass reads) / interval."""
    audit_max_share: float = 0.03
    """The most of the time the continuous auditor's steps may take: after a step that
    took t seconds it pauses at least t * (1 - share) / share, so its calls hold Redis
    at most this share of the time whatever a pass costs (a pass longer than the
    interval then runs slower, not harder). With dispatch bound by Redis this bounds the
    audit's cost to dispatch throughput. In (0, 1]."""
    audit_archiver_behind_ms: int = 60_000
    """With an archive (postgres_dsn): how old the first event-log entry the archiver has
    not archived may be before the continuous auditor reports the shard archiver_behind
    (the default of `timewheel audit --archive --archiver-behind-s`)."""
    canary_interval_ms: int = 10_000
    """How often the auditing node sends one canary task through each shard (0: none)."""
    canary_deadline_ms: int = 5_000
    """How long after its due time a canary may take to be acknowledged before its shard
    counts as missing it (timewheel_canary_missing, finding canary_missing)."""
    admin_key: str = field(default="", repr=False)
    """The bootstrap admin API key (TIMEWHEEL_ADMIN_KEY); empty: no admin key. Only its
    SHA-256 is kept by the API process. Tenant keys are issued with it and live in Redis."""
    postgres_dsn: str = ""
    """PostgreSQL DSN of the archive ('' = none). The archiver, snapshot and restore need
    it; with it the API's run history falls back to PostgreSQL for events the event log no
    longer holds. (Trimming does not read it: it follows the mark the archiver leaves in
    each shard's meta hash.)"""
    archive_batch: int = 1000
    """Most event-log entries the archiver reads from one shard per PostgreSQL transaction."""
    archive_hard_cap: int = 1_000_000
    """Safety valve, entries per shard: once the archiver has marked a shard, its event log
    is trimmed only past the archiver's checkpoint, unless the log grows past this (an
    archiver that stopped for good must not let Redis run out of memory; those events are
    then lost to PostgreSQL, and the archiver logs the gap). The archiver writes it into
    each shard's meta hash with its mark."""
    http_header_timeout_s: int = 10
    """How long the api's HTTP server waits for a complete request head (request line and
    headers): from the connection's opening, and on a kept-alive connection from the first
    byte of the next request. Past it the connection is closed without an answer, so
    connections that never finish a request do not hold the server."""
    http_keepalive_s: int = 5
    """How long an idle kept-alive connection stays open after its last answer."""
    http_body_timeout_s: int = 30
    """How long the api's HTTP server waits on a client in the middle of a request or an
    answer: for the next part of a request body being read (past it: 408
    request_timeout, and the connection is closed), or for the client to take the next
    part of a large answer (past it the connection is dropped)."""
    http_max_header_bytes: int = 16_384
    """Largest request head (request line and headers). A longer one is answered 431
    headers_too_large and its connection closed; the bytes are counted as they arrive, so
    an endless header is cut at the limit."""
    http_max_connections: int = 1000
    """Open connections of one api process past which a request is answered 503
    unavailable (Retry-After: 1) and its connection closed. Idle and unfinished
    connections count until http_keepalive_s or http_header_timeout_s closes them; the
    process needs a file descriptor limit (ulimit -n) above this."""
    http_max_body_bytes: int = 16_777_216
    """Largest request body on any route, checked before anything reads it: a larger
    Content-Length is answered 413 payload_too_large at once, and a chunked body is cut
    there. An endpoint may take less: a single create or update at most twice
    max_payload_bytes plus 64 KiB; a batch create at most 16 MiB, even with a higher setting."""

    def __post_init__(self) -> None:
        if self.shards < 1 or self.shards > MAX_SHARDS or self.shards & (self.shards - 1):
            raise ConfigError(
                f"Setting 'shards' has value {self.shards}. Not a power of two in 1..{MAX_SHARDS}."
            )
        for name in (
            "bucket_ms",
            "horizon_ms",
            "tick_batch",
            "tick_pipeline_runs",
            "promote_batch",
            "sweep_ms",
            "event_log_max",
            "max_payload_bytes",
            "default_spread",
            "poll_cap_ms",
            "misfire_ms",
            "plan_horizon_ms",
            "plan_batch",
            "plan_interval_ms",
            "archive_batch",
            "tenant_max_pending",
            "tenant_max_payload_total_bytes",
            "tenant_max_schedules",
            "tenant_max_queues",
            "tenant_min_interval_s",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(
                    f"Setting {name!r} has value {getattr(self, name)}. Must be >= 1."
                )
        if self.retry_jitter not in ("full", "proportional", "none"):
            raise ConfigError(
                f"Setting 'retry_jitter' has value {self.retry_jitter!r}. "
                "Use full, proportional or none."
            )
        if self.retry_factor < 1:
            raise ConfigError(
                f"Setting 'retry_factor' has value {self.retry_factor}. Must be >= 1."
            )
        if self.archive_hard_cap < self.event_log_max:
            raise ConfigError(
                f"Setting 'archive_hard_cap' has value {self.archive_hard_cap}. "
                f"Must be >= event_log_max ({self.event_log_max})."
            )
        self._check_ratios()
        if is_sentinel_url(self.redis_url):
            parse_sentinel_url(self.redis_url)  # a bad one is refused before any connection
        if self.tick_batch > 5000 or self.promote_batch > 5000:
            raise ConfigError("Settings 'tick_batch' and 'promote_batch' must be <= 5000.")
        if not self.prefix or any(c in self.prefix for c in "{}: "):
            raise ConfigError(
                f"Setting 'prefix' has value {self.prefix!r}. No braces, colons, spaces."
            )
        for name, least in (
            ("http_header_timeout_s", 1),
            ("http_keepalive_s", 1),
            ("http_body_timeout_s", 1),
            ("http_max_header_bytes", 1024),
            ("http_max_connections", 1),
            ("http_max_body_bytes", 1),
            ("storage_max_bytes", 0),
            ("tenant_max_backlog", 0),
            ("audit_interval_ms", 0),
            ("audit_step_budget", 1),
            ("audit_archiver_behind_ms", 0),
            ("canary_interval_ms", 0),
            ("canary_deadline_ms", 1),
        ):
            if getattr(self, name) < least:
                raise ConfigError(
                    f"Setting {name!r} has value {getattr(self, name)}. Must be >= {least}."
                )

    def _check_ratios(self) -> None:
        for ratio in ("storage_guard_ratio", "audit_max_share"):
            if not 0 < getattr(self, ratio) <= 1:
                raise ConfigError(
                    f"Setting {ratio!r} has value {getattr(self, ratio)}. Must be in (0, 1]."
                )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Settings from TIMEWHEEL_<FIELD> variables (e.g. TIMEWHEEL_REDIS_URL), then overrides."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(f"TIMEWHEEL_{f.name.upper()}")
            if raw is None:
                continue
            if f.type in ("int", "float"):
                try:
                    values[f.name] = int(raw) if f.type == "int" else float(raw)
                except ValueError:
                    raise ConfigError(
                        f"Config 'TIMEWHEEL_{f.name.upper()}' has value {raw!r}. "
                        f"Not a valid {f.type}."
                    ) from None
            else:
                values[f.name] = raw
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def retry_defaults_json(self) -> str:
        """The deployment's retry policy as the Lua scripts take it (seconds, as in tasks)."""
        return json.dumps(
            {
                "max_attempts": self.retry_max_attempts,
                "initial_s": self.retry_initial_ms / 1000,
                "factor": self.retry_factor,
                "max_s": self.retry_max_ms / 1000,
                "jitter": self.retry_jitter,
            }
        )
