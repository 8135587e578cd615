"""Counts that reconcile, per tenant: `timewheel audit --counts` (docs/operations/auditing.md).

Two views of each tenant, read from the archive (PostgreSQL) and from Redis together:

- **The window:** every run the archive saw created in the last `window_ms`, by the state
  its last archived event left it in, so that created = pending + in flight + succeeded
  + dead + cancelled + skipped + purged. A run finished and then expired from Redis
  (retention writes no event) is counted as what it finished as.
- **The open runs:** the tenant's counted runs not finished (one-shot tasks, and runs of
  a schedule asked for by hand: lua/lib/usage.lua) as the archive holds them (scheduled
  or dispatched) against the count Redis keeps with every change (`use:<tenant>`, the
  q:* counts less schedules, summed over every shard the tenant has used). Equal once
  the archive holds every event of the tenant: a difference is a run Redis dropped or
  counted twice, or one whose events never reached the archive (`count_mismatch`).

Exact under load, the way the usage check is (timewheel/audit/events.py): the archive's
counts and its checkpoints are read in one snapshot (REPEATABLE READ), then the usage
hashes, then every event-log entry after each shard's checkpoint. A tenant named by one
of those entries has events the archive does not hold yet, or changed while it was read:
it is reported as unsettled and not judged. A shard with more than UNARCHIVED_READ such
entries (an archiver far behind) leaves every tenant of it unsettled.

Incremental: `step(budget)` reads about `budget` things (tenants' usage hashes, event-log
entries) per call after the one PostgreSQL snapshot, so the continuous auditor runs the
check within its step budget; `check()` goes to the end. Reading the usage hashes over
many steps keeps it exact: every usage change writes an event in the same call, and the
event logs are read after the last usage hash.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import psycopg
import structlog
from redis.exceptions import RedisError

from timewheel.archive import pg
from timewheel.archive.events import event_rows
from timewheel.audit.findings import Finding, Kind
from timewheel.dispatch.metrics import INTERNAL_TENANT
from timewheel.errors import PostgresUnavailable, RedisUnavailable
from timewheel.store.shard import Store

log = structlog.get_logger("timewheel.audit")

STATES = ("scheduled", "dispatched", "succeeded", "dead", "cancelled", "skipped", "purged")
"""The states the archive records a run in (timewheel/archive/events.py, STATE_AFTER)."""
OPEN_STATES = ("scheduled", "dispatched")
UNARCHIVED_READ = 10_000
"""Event-log entries after a shard's checkpoint the check reads at most."""

# A counted run (lua/lib/usage.lua, usage_counted): not a schedule's (a schedule's run
# ids carry '@'), or one asked for by hand (its options name its origin).
_COUNTED = "(position('@' in run_id) = 0 OR opts LIKE '%\"origin\":%')"
_WINDOW = """
SELECT tenant, state, count(*) FROM tasks
WHERE created_ms >= %s GROUP BY tenant, state
"""
_OPEN = f"""
SELECT tenant, count(*) FROM tasks
WHERE state IN ('scheduled', 'dispatched') AND {_COUNTED} GROUP BY tenant
"""
_CHECKPOINTS = "SELECT shard, last_ms, last_seq FROM archive_checkpoints WHERE shard >= 0"


@dataclass(slots=True)
class TenantCounts:
    """One tenant's counts (see the module's doc)."""

    tenant: str
    states: dict[str, int] = field(default_factory=dict)
    """Runs created in the window, by archived state."""
    open_archive: int = 0
    open_redis: int = 0
    settled: bool = True
    """False: the tenant has events the archive does not hold yet; not judged."""

    @property
    def created(self) -> int:
        return sum(self.states.values())

    @property
    def balanced(self) -> bool:
        return not self.settled or self.open_archive == self.open_redis

    def to_json(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "created": self.created,
            **{state: self.states.get(state, 0) for state in STATES},
            "open_archive": self.open_archive,
            "open_redis": self.open_redis,
            "settled": self.settled,
        }


PHASES = ("archive", "tenants", "usage", "events", "judge", "done")
"""A check's phases, in order."""


@dataclass(slots=True)
class CountCheck:
    """Per-tenant counts of the archive against Redis's (one check per audit pass: `begin`,
    then `step` until `done`, or `check`)."""

    store: Store
    dsn: str
    window_ms: int | None = 3_600_000
    """None: no counts by state over a window (the continuous auditor judges the open
    runs only, and spares PostgreSQL the query)."""
    tolerant: bool = False
    """An archive that cannot be read is logged and the check finds nothing this time
    (the continuous auditor), instead of raising."""
    tenants: list[TenantCounts] = field(default_factory=list)
    """The last check's counts, by tenant name."""
    phase: str = "done"
    _now_ms: int = 0
    _window: Counter[tuple[str, str]] = field(default_factory=Counter)
    _open_archive: dict[str, int] = field(default_factory=dict)
    _checkpoints: dict[int, tuple[int, int]] = field(default_factory=dict)
    _names: list[str] = field(default_factory=list)
    _shards: dict[str, list[int]] = field(default_factory=dict)
    _open_redis: Counter[str] = field(default_factory=Counter)
    _at: int = 0
    """The next tenant (usage phase) or shard (events phase)."""
    _after: str = ""
    """The events phase: the last entry read in the current shard ('' : its checkpoint)."""
    _read: int = 0
    """Entries read in the current shard."""
    _moved: dict[int, set[str] | None] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.phase == "done"

    def begin(self, now_ms: int | None = None) -> None:
        """Start a check (the next `step` reads the archive)."""
        self._now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        self.phase = "archive"
        self._window, self._open_archive, self._checkpoints = Counter(), {}, {}
        self._names, self._shards, self._open_redis, self._moved = [], {}, Counter(), {}
        self._at, self._after, self._read = 0, "", 0

    async def check(self, now_ms: int | None = None) -> list[Finding]:
        """Read both sides at once; the findings (count_mismatch for each settled tenant
        whose open runs differ)."""
        self.begin(now_ms)
        findings: list[Finding] = []
        while not self.done:
            findings += (await self.step(1 << 30))[1]
        return findings

    async def step(self, budget: int) -> tuple[int, list[Finding]]:
        """About `budget` things read; (things read, the findings once the check ends)."""
        if self.phase == "archive":
            try:
                since = None if self.window_ms is None else self._now_ms - self.window_ms
                self._window, self._open_archive, self._checkpoints = await self._archive(since)
            except PostgresUnavailable as exc:
                if not self.tolerant:
                    raise
                log.warning("audit_counts_unreadable", error=str(exc))
                self.phase = "done"
                return 1, []
            self.phase = "tenants"
            return 1 + len(self._open_archive) + len(self._window), []
        if self.phase == "tenants":
            registered = await self._registered()
            names = {t for t, _ in self._window} | set(self._open_archive) | set(registered)
            self._names = sorted(names - {INTERNAL_TENANT})
            self.phase = "usage"
            return max(1, len(registered)), []
        if self.phase == "usage":
            return await self._usage_step(budget), []
        if self.phase == "events":
            return await self._events_step(budget), []
        if self.phase == "judge":
            return 1, self._judge()
        return 0, []

    def _judge(self) -> list[Finding]:
        out: list[TenantCounts] = []
        for tenant in self._names:
            row = TenantCounts(tenant)
            for (t, state), n in self._window.items():
                if t == tenant:
                    row.states[state] = n
            row.open_archive = self._open_archive.get(tenant, 0)
            row.open_redis = self._open_redis.get(tenant, 0)
            row.settled = all(_quiet(self._moved, s, tenant) for s in self._shards[tenant])
            out.append(row)
        self.tenants = out
        self.phase = "done"
        self._moved, self._window = {}, Counter()
        return [
            Finding(
                Kind.COUNT_MISMATCH,
                self._shards[row.tenant][0],
                row.tenant,
                "",
                f"the archive holds {row.open_archive} counted runs not finished, "
                f"Redis counts {row.open_redis} (use:{row.tenant} over its shards)",
            )
            for row in out
            if not row.balanced
        ]

    async def _archive(
        self, since_ms: int | None
    ) -> tuple[Counter[tuple[str, str]], dict[str, int], dict[int, tuple[int, int]]]:
        try:
            async with pg.connection(self.dsn) as conn:
                await conn.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
                async with conn.transaction():
                    window: list[tuple[Any, ...]] = []
                    if since_ms is not None:
                        window = await (await conn.execute(_WINDOW, (since_ms,))).fetchall()
                    opened = await (await conn.execute(_OPEN)).fetchall()
                    marks = await (await conn.execute(_CHECKPOINTS)).fetchall()
        except psycopg.Error as exc:
            raise PostgresUnavailable(f"reading the archive's counts: {exc}") from exc
        counts: Counter[tuple[str, str]] = Counter()
        for tenant, state, n in window:
            counts[(str(tenant or ""), str(state))] += int(str(n))
        return (
            counts,
            {str(t or ""): int(str(n)) for t, n in opened},
            {int(str(s)): (int(str(ms)), int(str(seq))) for s, ms, seq in marks},
        )

    async def _registered(self) -> list[str]:
        try:
            names: Any = await self.store.client.hkeys(self.store.keys.tenants())
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"reading the tenants: {exc}") from exc
        return [n.decode() if isinstance(n, bytes) else str(n) for n in names]

    async def _usage_step(self, budget: int) -> int:
        """The usage hashes of the next tenants, about `budget` hashes."""
        chunk: list[tuple[str, int]] = []
        while self._at < len(self._names) and len(chunk) < budget:
            tenant = self._names[self._at]
            self._at += 1
            self._shards[tenant] = shards = await self.store.tenant_shards(tenant)
            chunk += [(tenant, shard) for shard in shards]
        if self._at >= len(self._names):
            self.phase, self._at = "events", 0
        try:
            pipe = self.store.client.pipeline(transaction=False)
            for tenant, shard in chunk:
                pipe.hgetall(self.store.keys.usage(shard, tenant))
            hashes: list[Any] = await pipe.execute() if chunk else []
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"reading usage counts: {exc}") from exc
        for (tenant, _), raw in zip(chunk, hashes, strict=True):
            self._open_redis[tenant] += open_runs(raw or {})
        return max(1, len(chunk))

    async def _events_step(self, budget: int) -> int:
        """The event-log entries after the checkpoint of the current shard, up to
        `budget` of them: the tenants they name (None past UNARCHIVED_READ)."""
        shard = self._at
        if shard >= self.store.settings.shards:
            self.phase = "judge"
            return 0
        if not self._after:
            mark = self._checkpoints.get(shard)
            self._after = "-" if mark is None else f"({mark[0]}-{mark[1]}"
        count = max(1, min(budget, UNARCHIVED_READ - self._read))
        try:
            entries: Any = await self.store.client.xrange(
                self.store.keys.events(shard), min=self._after, max="+", count=count
            )
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"reading the event log: {exc}") from exc
        self._read += len(entries)
        if entries:
            named = self._moved.setdefault(shard, set())
            if named is not None:
                named.update(
                    str(row[6] or "")
                    for entry_id, fields in entries
                    for row in event_rows(shard, entry_id, fields)
                )
            last = entries[-1][0]
            self._after = "(" + (last.decode() if isinstance(last, bytes) else str(last))
        if self._read >= UNARCHIVED_READ:
            self._moved[shard] = None
        if len(entries) < count or self._read >= UNARCHIVED_READ:
            self._at, self._after, self._read = shard + 1, "", 0
        return max(1, len(entries))


def _quiet(moved: dict[int, set[str] | None], shard: int, tenant: str) -> bool:
    """Whether no entry of `shard` after its checkpoint may name `tenant`."""
    if shard not in moved:
        return True
    named = moved[shard]
    return named is not None and tenant not in named


def open_runs(raw: dict[Any, Any]) -> int:
    """A tenant's counted runs not finished in one shard, from its usage hash: the q:*
    counts less schedules (lua/lib/usage.lua)."""
    counts = {(k.decode() if isinstance(k, bytes) else str(k)): int(v) for k, v in raw.items()}
    queues = sum(n for name, n in counts.items() if name.startswith("q:"))
    return max(0, queues - counts.get("schedules", 0))


def render(rows: list[TenantCounts]) -> str:
    """The counts as a table: one row per tenant."""
    head = ("TENANT", "CREATED", *(s.upper() for s in STATES), "OPEN(PG)", "OPEN(REDIS)", "")
    table = [head]
    for r in rows:
        note = "" if r.settled else "unsettled (events not archived yet)"
        if r.settled and not r.balanced:
            note = "MISMATCH"
        table.append(
            (
                r.tenant,
                str(r.created),
                *(str(r.states.get(s, 0)) for s in STATES),
                str(r.open_archive),
                str(r.open_redis),
                note,
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(head) - 1)]
    lines = ["  ".join([*(row[i].ljust(widths[i]) for i in range(len(widths))), row[-1]]).rstrip()
             for row in table]  # fmt: skip
    return "\n".join(lines) + "\n"
