"""The archiver: tails every shard's event log into PostgreSQL, exactly once.

Each round reads up to `archive_batch` entries per shard after that shard's checkpoint,
and writes their rows (COPY into run_events, an upsert into tasks) and the new
checkpoints in ONE PostgreSQL transaction. A crash before the commit leaves neither rows
nor checkpoint, and the next start reads the same entries again; a crash after it has
both. So PostgreSQL holds every event exactly once (the primary key of run_events would
refuse a double anyway).

After the commit the checkpoint is also written to the shard's meta hash ('archived',
with the hard cap 'archive_cap' and the time 'archived_at', which the continuous auditor
exports), which bounds how far lua/lib/events.lua may trim.
That copy may lag PostgreSQL's (a crash between the two): a lagging mark only trims less.

`created` and `updated` events carry no payload; the archiver reads it from the run's
record (HGET of its body hash) right after reading the entries. A record already gone
(expired or purged) leaves payload null; a record updated again meanwhile gives the newer
payload, which the later `updated` entry would set anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import psycopg
import structlog
from redis.exceptions import RedisError

from timewheel.archive import pg, rounds, tenancy
from timewheel.archive.events import (
    StreamId,
    event_rows,
    format_id,
    parse_id,
)
from timewheel.archive.snapshot import take_snapshot
from timewheel.errors import ConfigError, PostgresUnavailable, RedisUnavailable
from timewheel.store.shard import Store

log = structlog.get_logger("timewheel.archiver")

BUSY_SLEEP_S = 0.01
"""Pause after a round that found entries but no full batch."""
REMARK_EVERY_S = 30.0
"""How often every shard's mark is written again, new events or not."""
RETRY_FIRST_S, RETRY_MAX_S = 0.1, 5.0
"""Backoff after a failed round, doubling up to the maximum."""


class Archiver:
    """Tails the event logs of one deployment into one PostgreSQL database."""

    def __init__(self, store: Store, conn: psycopg.AsyncConnection[tuple[object, ...]]):
        self.store = store
        self.conn = conn
        self.batch = store.settings.archive_batch
        self.checkpoints: dict[int, StreamId | None] = {}
        self.tenant_checkpoint: StreamId | None = None
        """The tenant change log's (timewheel/archive/tenancy.py)."""
        self.archived_total = 0

    async def start(self) -> None:
        """Apply migrations, load the checkpoints, and mark them in every shard's meta."""
        try:
            await pg.migrate(self.conn)
        except psycopg.Error as exc:
            raise PostgresUnavailable(f"applying migrations failed: {exc}") from exc
        await self.load_checkpoints()
        await self._check_gaps()
        log.info("archiver_started", shards=len(self.checkpoints), batch=self.batch)

    async def load_checkpoints(self) -> None:
        """Read the checkpoints from PostgreSQL (the truth) and mark them in Redis."""
        try:
            cur = await self.conn.execute(
                "SELECT shard, last_ms, last_seq FROM archive_checkpoints"
            )
            rows = await cur.fetchall()
            await self.conn.commit()
        except psycopg.Error as exc:
            raise PostgresUnavailable(f"cannot read the checkpoints: {exc}") from exc
        stored = {int(str(r[0])): (int(str(r[1])), int(str(r[2]))) for r in rows}
        self.checkpoints = {s: stored.get(s) for s in range(self.store.settings.shards)}
        self.tenant_checkpoint = stored.get(tenancy.LOG_SHARD)
        await self._mark(dict(self.checkpoints))

    async def recover(self, dsn: str) -> None:
        """After a failure: a new PostgreSQL connection if the old one broke (and a DSN is
        known), then the checkpoints again from PostgreSQL. Reloading matters: a commit
        whose acknowledgement was lost may have stored the batch, and the next round must
        start after it, not read it again."""
        if dsn and self.conn.closed:
            self.conn = await pg.connect(dsn)
        elif self.conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            with contextlib.suppress(psycopg.Error):
                await self.conn.rollback()
        await self.load_checkpoints()

    async def _check_gaps(self) -> None:
        """Log every shard whose log was trimmed past our checkpoint (hard cap reached)."""
        client, keys = self.store.client, self.store.keys
        for shard, checkpoint in self.checkpoints.items():
            if checkpoint is None:
                continue
            try:
                info: Any = await client.xinfo_stream(keys.events(shard))
            except RedisError:
                continue  # no log yet
            deleted = info.get("max-deleted-entry-id")
            if deleted is not None and parse_id(deleted) > checkpoint:
                log.error(
                    "archive_gap",
                    shard=shard,
                    checkpoint=format_id(checkpoint),
                    trimmed_up_to=deleted.decode() if isinstance(deleted, bytes) else deleted,
                    hint="the event log passed archive_hard_cap while the archiver was away",
                )

    async def _mark(self, marks: dict[int, StreamId | None]) -> None:
        """Write the checkpoints into the shards' meta hashes (bounds trimming)."""
        if not marks:
            return
        cap = self.store.settings.archive_hard_cap
        at_ms = int(time.time() * 1000)  # archived_at: the auditor's last-commit metric
        pipe = self.store.client.pipeline(transaction=False)
        for shard, checkpoint in marks.items():
            mark = "0-0" if checkpoint is None else format_id(checkpoint)
            fields = {"archived": mark, "archive_cap": cap, "archived_at": at_ms}
            pipe.hset(self.store.keys.meta(shard), mapping=fields)  # type: ignore[arg-type]
        try:
            await pipe.execute()
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"cannot write the archive mark: {exc}") from exc

    async def _read(self) -> dict[int, list[tuple[bytes, dict[bytes, bytes]]]]:
        keys = self.store.keys
        shards = sorted(self.checkpoints)
        pipe = self.store.client.pipeline(transaction=False)
        for shard in shards:
            checkpoint = self.checkpoints[shard]
            start = "-" if checkpoint is None else "(" + format_id(checkpoint)
            pipe.xrange(keys.events(shard), min=start, max="+", count=self.batch)
        try:
            replies: list[Any] = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"cannot read the event logs: {exc}") from exc
        return {shard: entries for shard, entries in zip(shards, replies, strict=True) if entries}

    async def run_once(self) -> int:
        """One round over every shard; returns the number of entries archived."""
        read = await self._read()
        named, tenant_position = await tenancy.read_log(
            self.store.client, self.store.keys, self.tenant_checkpoint, self.batch
        )
        if not read and tenant_position is None:
            return 0
        tenants = await tenancy.read_tenants(self.store.client, self.store.keys, named)
        rows: list[list[Any]] = []
        advanced: dict[int, StreamId | None] = {}
        for shard, entries in read.items():
            for entry_id, fields in entries:
                rows.extend(event_rows(shard, entry_id, fields))
            advanced[shard] = parse_id(entries[-1][0])
        await rounds.fill_payloads(self.store, rows)
        schedules = await rounds.schedule_changes(self.store, rows)
        if tenant_position is not None:
            advanced[tenancy.LOG_SHARD] = tenant_position
        try:
            async with self.conn.transaction(), self.conn.cursor() as cur:
                await rounds.write(cur, rows, schedules=schedules, tenants=tenants, marks=advanced)
        except psycopg.Error as exc:
            raise PostgresUnavailable(f"archiving a batch failed: {exc}") from exc
        if tenant_position is not None:
            self.tenant_checkpoint = advanced.pop(tenancy.LOG_SHARD)
        self.checkpoints.update(advanced)
        await self._mark(advanced)
        count = sum(len(entries) for entries in read.values()) + len(named)
        self.archived_total += count
        return count

    async def run(
        self,
        stop: asyncio.Event,
        *,
        poll_interval_s: float = 0.1,
        snapshot_every_s: float | None = None,
        dsn: str = "",
        drain_s: float = 0.0,
    ) -> None:
        """Archive until `stop` is set; take a snapshot every `snapshot_every_s` if given;
        then, for at most `drain_s`, archive what is left until a round finds nothing (so
        a process stopped after the writers narrows what only the AOF holds to nothing).

        A round that found a full batch goes again at once; one that found some entries
        sleeps BUSY_SLEEP_S (small batches, low lag under load); an idle one sleeps
        `poll_interval_s` (an idle archiver costs one pipelined XRANGE per shard per
        interval, and the first event after a quiet spell waits at most that).
        """
        snapshots: asyncio.Task[None] | None = None
        if snapshot_every_s:
            snapshots = asyncio.create_task(self._snapshots(stop, snapshot_every_s, dsn))
        failing, backoff_s = False, RETRY_FIRST_S
        remark_at = time.monotonic() + REMARK_EVERY_S
        try:
            while not stop.is_set():
                try:
                    if failing:
                        await self.recover(dsn)
                    if time.monotonic() >= remark_at:
                        # Again every so often: a meta hash can vanish (FLUSHALL, a
                        # restore) while a shard has no new events to mark it.
                        await self._mark(dict(self.checkpoints))
                        remark_at = time.monotonic() + REMARK_EVERY_S
                    count = await self.run_once()
                except (RedisUnavailable, PostgresUnavailable, ConfigError) as exc:
                    # Ride through restarts and failovers of either server: nothing is
                    # lost meanwhile, the log keeps what was not archived.
                    log.warning("archiver_retrying", error=str(exc), retry_in_s=backoff_s)
                    failing = True
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), backoff_s)
                    backoff_s = min(backoff_s * 2, RETRY_MAX_S)
                    continue
                if failing:
                    log.info("archiver_recovered")
                failing, backoff_s = False, RETRY_FIRST_S
                if count:
                    log.debug("archived", entries=count, total=self.archived_total)
                if count < self.batch:
                    pause = BUSY_SLEEP_S if count else poll_interval_s
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), pause)
        finally:
            if snapshots is not None:
                snapshots.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await snapshots
        if drain_s > 0 and not failing:
            await self.drain(drain_s)

    async def drain(self, limit_s: float) -> int:
        """Archive rounds until one finds nothing or `limit_s` passed; the entries
        archived. A server that fails meanwhile ends it (logged): what is left stays in
        the event log for the next start."""
        deadline, total = time.monotonic() + limit_s, 0
        try:
            while time.monotonic() < deadline:
                count = await self.run_once()
                total += count
                if count == 0:
                    log.info("archiver_drained", entries=total)
                    return total
        except (RedisUnavailable, PostgresUnavailable, ConfigError) as exc:
            log.warning("archiver_drain_stopped", error=str(exc), entries=total)
            return total
        log.warning("archiver_drain_unfinished", entries=total, limit_s=limit_s)
        return total

    async def _snapshots(self, stop: asyncio.Event, every_s: float, dsn: str) -> None:
        """Take a snapshot every `every_s` seconds on a connection of its own; the first
        one as soon as the newest complete snapshot is `every_s` old (at once if none)."""
        wait_s = every_s
        try:
            async with pg.connection(dsn) as conn:
                cur = await conn.execute(
                    "SELECT extract(epoch FROM now() - max(finished_at)) FROM snapshots"
                )
                row = await cur.fetchone()
            age_s = None if row is None or row[0] is None else float(str(row[0]))
            wait_s = 0 if age_s is None else max(0.0, every_s - age_s)
        except (PostgresUnavailable, ConfigError) as exc:
            log.error("snapshot_age_unknown", error=str(exc))
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait_s)
            if stop.is_set():
                return
            wait_s = every_s
            try:
                async with pg.connection(dsn) as conn:
                    await take_snapshot(self.store, conn)
            except (PostgresUnavailable, RedisUnavailable) as exc:
                log.error("snapshot_failed", error=str(exc))
