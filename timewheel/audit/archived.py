"""The archive against Redis: every run PostgreSQL holds as open (its last archived event
leaves it scheduled or dispatched) must still have its record in Redis
(docs/operations/auditing.md, `archive_run_lost`).

A record goes away only after its run finished (past its retention) or its dead letter was
purged, and both follow an event the archiver archives; so an open run in the archive with
no record in Redis was dropped from Redis (a lost write, a flush, a restore that missed it).
A run whose finishing event the archiver has not archived yet still has its record for
`retention_ms`, so an archiver that is behind does not make findings, unless it is a whole
retention behind.

Bounded: the open runs are read in run id order, BATCH at a time, from where the last
check stopped (the cursor wraps at the end), at most `limit` per check.

The same check judges the archiver itself (`archiver_behind`): per shard, the first
event-log entry after the archiver's checkpoint (lua/audit_archive.lua; with no
checkpoint, the log's first entry) is older than `behind_ms`. The entry ids are the
shard primary's clock, and so is the age, so a node's clock does not enter it. An
archiver that stopped with nothing left to archive is not behind; one that stopped
while events keep coming is, `behind_ms` after the first of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
import structlog
from redis.exceptions import RedisError

from timewheel.archive import pg
from timewheel.audit.findings import Finding, Kind
from timewheel.errors import PostgresUnavailable, RedisUnavailable
from timewheel.store.shard import Call, Store, clock_arg
from timewheel.types import ms_to_rfc3339, text

log = structlog.get_logger("timewheel.audit")

COUNT_BEHIND = 10_000
"""Event-log entries audit_archive counts one by one per shard (lua/audit_archive.lua)."""

BATCH = 1000
_OPEN = """
SELECT run_id, shard, tenant, state FROM tasks
WHERE run_id > %s AND state IN ('scheduled', 'dispatched')
ORDER BY run_id LIMIT %s
"""


@dataclass(frozen=True, slots=True)
class ArchiverView:
    """How far the archiver is behind one shard's event log (lua/audit_archive.lua)."""

    shard: int
    mark: str
    """The archiver's checkpoint ('' : no archiver ever marked the shard)."""
    at_ms: int | None
    """When the archiver last wrote the mark (None: unknown)."""
    behind: int
    """Entries after the checkpoint (exact up to COUNT_BEHIND)."""
    length: int
    oldest: str
    """The first entry not archived ('' : none)."""
    now_ms: int

    @property
    def oldest_age_ms(self) -> int | None:
        """How old the first entry not archived is, by the shard's clock (None: none)."""
        if not self.oldest:
            return None
        return max(0, self.now_ms - int(self.oldest.split("-", 1)[0]))


def _view(shard: int) -> Any:
    def decode(reply: list[Any]) -> ArchiverView:
        at = text(reply[1])
        return ArchiverView(
            shard,
            text(reply[0]),
            int(at) if at else None,
            int(reply[2]),
            int(reply[3]),
            text(reply[4]),
            int(reply[5]),
        )

    return decode


async def archiver_views(store: Store, now_ms: int | None = None) -> list[ArchiverView]:
    """Every shard's view of the archiver, in one pipeline."""
    k = store.keys
    calls = [
        Call(
            store.scripts.audit_archive,
            [k.meta(shard), k.events(shard)],
            [COUNT_BEHIND, clock_arg(now_ms)],
            _view(shard),
        )
        for shard in range(store.settings.shards)
    ]
    return await store.run_many(calls)


def _entries(n: int) -> str:
    return f"{n:,} event-log entr{'y' if n == 1 else 'ies'}"


def behind_findings(views: list[ArchiverView], behind_ms: int) -> list[Finding]:
    """archiver_behind for each shard whose first entry not archived is older than
    `behind_ms`."""
    out = []
    for v in views:
        age = v.oldest_age_ms
        if age is None or age <= behind_ms:
            continue
        if v.mark:
            commit = ms_to_rfc3339(v.at_ms) if v.at_ms is not None else "at an unknown time"
            where = (
                f"the archiver has not archived {_entries(v.behind)} after its checkpoint "
                f"(last written {commit})"
            )
        else:
            where = f"no archiver has marked the shard: {_entries(v.length)} not archived"
        out.append(
            Finding(
                Kind.ARCHIVER_BEHIND,
                v.shard,
                "",
                v.oldest,
                f"{where}; the first of them is {age / 1000:.1f} s old "
                f"(more than {behind_ms / 1000:g} s)",
            )
        )
    return out


class ArchiveCheck:
    """The open runs of the archive, checked against Redis a batch at a time; and the
    archiver's progress through every shard's event log."""

    def __init__(
        self,
        store: Store,
        dsn: str,
        *,
        tolerant: bool = False,
        behind_ms: int | None = None,
    ):
        """tolerant: an archive that cannot be read is logged, and the check finds
        nothing this time (the continuous auditor), instead of raising. behind_ms: an
        entry not archived older than this is archiver_behind (None: not checked)."""
        self.store = store
        self.dsn = dsn
        self.tolerant = tolerant
        self.behind_ms = behind_ms
        self.after = ""
        """The run id the next check goes on after ('' = from the start)."""
        self.checked = 0
        self.views: list[ArchiverView] = []
        """Every shard's view of the archiver, as the last `behind` check read it."""

    async def behind(self) -> list[Finding]:
        """The archiver_behind findings (none when behind_ms is None)."""
        if self.behind_ms is None:
            return []
        try:
            self.views = await archiver_views(self.store)
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"reading the archiver's checkpoints: {exc}") from exc
        return behind_findings(self.views, self.behind_ms)

    async def check(self, limit: int | None = None) -> list[Finding]:
        """Check up to `limit` open runs (None: all of them, from the start); findings."""
        try:
            return await self._check(limit)
        except PostgresUnavailable as exc:
            if not self.tolerant:
                raise
            log.warning("audit_archive_unreadable", error=str(exc))
            return []

    async def _check(self, limit: int | None) -> list[Finding]:
        if limit is None:
            self.after = ""
        left = limit
        findings: list[Finding] = []
        try:
            async with pg.connection(self.dsn) as conn:
                while left is None or left > 0:
                    size = BATCH if left is None else min(BATCH, left)
                    cur = await conn.execute(_OPEN, (self.after, size))
                    rows = await cur.fetchall()
                    await conn.commit()
                    findings += await self._missing(rows)
                    self.checked += len(rows)
                    if left is not None:
                        left -= len(rows)
                    if len(rows) < size:
                        self.after = ""  # the end: the next check starts over
                        break
                    self.after = str(rows[-1][0])
        except psycopg.Error as exc:
            raise PostgresUnavailable(f"reading the archive's open runs: {exc}") from exc
        return findings

    async def _missing(self, rows: list[tuple[Any, ...]]) -> list[Finding]:
        if not rows:
            return []
        present = await self.store.records(
            [(int(shard), str(run_id)) for run_id, shard, _, _ in rows]
        )
        return [
            Finding(
                Kind.ARCHIVE_RUN_LOST,
                int(shard),
                str(tenant or ""),
                str(run_id),
                f"the archive holds it {state} but Redis has no record of it",
            )
            for (run_id, shard, tenant, state), here in zip(rows, present, strict=True)
            if not here
        ]
