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
"""

from __future__ import annotations

from typing import Any

import psycopg
import structlog
from redis.exceptions import RedisError

from timewheel.archive import pg
from timewheel.audit.findings import Finding, Kind
from timewheel.errors import PostgresUnavailable, RedisUnavailable
from timewheel.store.shard import Store

log = structlog.get_logger("timewheel.audit")

BATCH = 1000
_OPEN = """
SELECT run_id, shard, tenant, state FROM tasks
WHERE run_id > %s AND state IN ('scheduled', 'dispatched')
ORDER BY run_id LIMIT %s
"""


class ArchiveCheck:
    """The open runs of the archive, checked against Redis a batch at a time."""

    def __init__(self, store: Store, dsn: str, *, tolerant: bool = False):
        """tolerant: an archive that cannot be read is logged, and the check finds
        nothing this time (the continuous auditor), instead of raising."""
        self.store = store
        self.dsn = dsn
        self.tolerant = tolerant
        self.after = ""
        """The run id the next check goes on after ('' = from the start)."""
        self.checked = 0

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
        keys = self.store.keys
        pipe = self.store.client.pipeline(transaction=False)
        for run_id, shard, _, _ in rows:
            pipe.hexists(keys.body(int(shard), str(run_id)), keys.body_field(str(run_id)))
        try:
            present: list[Any] = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"reading records for the archive check: {exc}") from exc
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
