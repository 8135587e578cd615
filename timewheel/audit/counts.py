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
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import psycopg
from redis.exceptions import RedisError

from timewheel.archive import pg
from timewheel.archive.events import event_rows
from timewheel.audit.findings import Finding, Kind
from timewheel.dispatch.metrics import INTERNAL_TENANT
from timewheel.errors import PostgresUnavailable, RedisUnavailable
from timewheel.store.shard import Store

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


@dataclass(slots=True)
class CountCheck:
    """Per-tenant counts of the archive against Redis's (one `check` per audit pass)."""

    store: Store
    dsn: str
    window_ms: int = 3_600_000
    tenants: list[TenantCounts] = field(default_factory=list)
    """The last check's counts, by tenant name."""

    async def check(self, now_ms: int | None = None) -> list[Finding]:
        """Read both sides; the findings (count_mismatch for each settled tenant whose
        open runs differ)."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        window, open_archive, checkpoints = await self._archive(now - self.window_ms)
        tenants = sorted(
            ({t for t, _ in window} | set(open_archive) | set(await self._registered()))
            - {INTERNAL_TENANT}
        )
        shards = {t: await self.store.tenant_shards(t) for t in tenants}
        open_redis = await self._usage(shards)
        moved = await self._unarchived(checkpoints)
        out: list[TenantCounts] = []
        for tenant in tenants:
            row = TenantCounts(tenant)
            for (t, state), n in window.items():
                if t == tenant:
                    row.states[state] = n
            row.open_archive = open_archive.get(tenant, 0)
            row.open_redis = open_redis.get(tenant, 0)
            row.settled = all(_quiet(moved, shard, tenant) for shard in shards[tenant])
            out.append(row)
        self.tenants = out
        return [
            Finding(
                Kind.COUNT_MISMATCH,
                shards[row.tenant][0],
                row.tenant,
                "",
                f"the archive holds {row.open_archive} counted runs not finished, "
                f"Redis counts {row.open_redis} (use:{row.tenant} over its shards)",
            )
            for row in out
            if not row.balanced
        ]

    async def _archive(
        self, since_ms: int
    ) -> tuple[Counter[tuple[str, str]], dict[str, int], dict[int, tuple[int, int]]]:
        try:
            async with pg.connection(self.dsn) as conn:
                await conn.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
                async with conn.transaction():
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

    async def _usage(self, shards: dict[str, list[int]]) -> dict[str, int]:
        pairs = [(t, s) for t, ss in shards.items() for s in ss]
        try:
            pipe = self.store.client.pipeline(transaction=False)
            for tenant, shard in pairs:
                pipe.hgetall(self.store.keys.usage(shard, tenant))
            hashes: list[Any] = await pipe.execute() if pairs else []
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"reading usage counts: {exc}") from exc
        out: Counter[str] = Counter()
        for (tenant, _), raw in zip(pairs, hashes, strict=True):
            out[tenant] += open_runs(raw or {})
        return dict(out)

    async def _unarchived(
        self, checkpoints: dict[int, tuple[int, int]]
    ) -> dict[int, set[str] | None]:
        """shard -> the tenants its entries after the checkpoint name (None: too many to
        read), for each shard with such entries."""
        client, keys = self.store.client, self.store.keys
        out: dict[int, set[str] | None] = {}
        try:
            for shard in range(self.store.settings.shards):
                mark = checkpoints.get(shard)
                start = "-" if mark is None else f"({mark[0]}-{mark[1]}"
                entries: Any = await client.xrange(
                    keys.events(shard), min=start, max="+", count=UNARCHIVED_READ
                )
                if not entries:
                    continue
                if len(entries) >= UNARCHIVED_READ:
                    out[shard] = None
                    continue
                out[shard] = {
                    str(row[6] or "")
                    for entry_id, fields in entries
                    for row in event_rows(shard, entry_id, fields)
                }
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"reading the event log: {exc}") from exc
        return out


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
