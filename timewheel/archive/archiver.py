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
import json
import time
from typing import Any

import psycopg
import structlog
from redis.exceptions import RedisError

from timewheel.archive import pg, tenancy
from timewheel.archive.events import (
    EVENT_COLUMNS,
    StreamId,
    TaskChange,
    event_rows,
    format_id,
    parse_id,
)
from timewheel.archive.snapshot import take_snapshot
from timewheel.errors import ConfigError, PostgresUnavailable, RedisUnavailable
from timewheel.store import record
from timewheel.store.shard import Call, Store

log = structlog.get_logger("timewheel.archiver")

RECORDS_PER_CALL = 1000
"""Run ids per lua/archive_records.lua call (its header's limit)."""
BUSY_SLEEP_S = 0.01
"""Pause after a round that found entries but no full batch."""
REMARK_EVERY_S = 30.0
"""How often every shard's mark is written again, new events or not."""
RETRY_FIRST_S, RETRY_MAX_S = 0.1, 5.0
"""Backoff after a failed round, doubling up to the maximum."""

_COPY_EVENTS = f"COPY run_events ({', '.join(EVENT_COLUMNS)}) FROM STDIN"
SCHEDULE_EVENTS = frozenset(
    {
        "schedule_created",
        "schedule_updated",
        "schedule_paused",
        "schedule_resumed",
        "schedule_deleted",
        "triggered",
        "backfilled",
    }
)
"""Events that name a schedule (id = schedule id), not a run."""

_UPSERT_SCHEDULE = """
INSERT INTO schedules (schedule_id, shard, tenant, definition) VALUES (%s, %s, %s, %s)
ON CONFLICT (schedule_id) DO UPDATE SET definition = EXCLUDED.definition
"""

TASK_COLUMNS = (
    "run_id",
    "shard",
    "tenant",
    "queue",
    "state",
    "attempt",
    "due_ms",
    "created_ms",
    "updated_ms",
    "payload",
    "opts",
    "last_error",
)
"""Columns of `tasks` a round sets, in TaskChange.params order."""
_CHANGES_TABLE = "CREATE TEMP TABLE IF NOT EXISTS task_changes (LIKE tasks) ON COMMIT DELETE ROWS"
_COPY_CHANGES = f"COPY task_changes ({', '.join(TASK_COLUMNS)}) FROM STDIN"
_UPSERT_TASKS = f"""
INSERT INTO tasks ({", ".join(TASK_COLUMNS)})
SELECT {", ".join(TASK_COLUMNS)} FROM task_changes
ON CONFLICT (run_id) DO UPDATE SET
    tenant = COALESCE(EXCLUDED.tenant, tasks.tenant),
    queue = COALESCE(EXCLUDED.queue, tasks.queue),
    state = EXCLUDED.state,
    attempt = COALESCE(EXCLUDED.attempt, tasks.attempt),
    due_ms = COALESCE(EXCLUDED.due_ms, tasks.due_ms),
    created_ms = COALESCE(EXCLUDED.created_ms, tasks.created_ms),
    updated_ms = COALESCE(EXCLUDED.updated_ms, tasks.updated_ms),
    payload = COALESCE(EXCLUDED.payload, tasks.payload),
    opts = COALESCE(EXCLUDED.opts, tasks.opts),
    last_error = COALESCE(EXCLUDED.last_error, tasks.last_error)
"""
"""Every changed run of a round in one statement, from a temporary table filled by COPY
(emptied at each commit; the run ids are distinct, a dict's keys, so no row is hit
twice). A statement per run (executemany) cost PostgreSQL a parse-bind-execute each,
and arrays (unnest) cost Python more than COPY does."""
_UPSERT_CHECKPOINTS = """
INSERT INTO archive_checkpoints (shard, last_ms, last_seq)
SELECT * FROM unnest(%s::integer[], %s::bigint[], %s::bigint[])
ON CONFLICT (shard) DO UPDATE SET last_ms = EXCLUDED.last_ms, last_seq = EXCLUDED.last_seq,
    updated_at = now()
"""


def _records(reply: list[Any]) -> list[Any]:
    """archive_records.lua's reply: a record (bytes) or None per run."""
    return reply


def _columns(rows: list[tuple[Any, ...]]) -> list[list[Any]]:
    """Rows as one list per column (the arrays an unnest() statement takes)."""
    return [list(column) for column in zip(*rows, strict=True)]


async def _store_rows(
    cur: psycopg.AsyncCursor[tuple[object, ...]],
    rows: list[list[Any]],
    changes: dict[str, TaskChange],
) -> None:
    """A round's run_events rows (COPY) and its changed runs (one upsert)."""
    async with cur.copy(_COPY_EVENTS) as copy:
        for row in rows:
            await copy.write_row(row)
    if changes:
        await cur.execute(_CHANGES_TABLE)
        async with cur.copy(_COPY_CHANGES) as copy:
            for run_id, change in changes.items():
                await copy.write_row(change.params(run_id))
        await cur.execute(_UPSERT_TASKS)


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

    async def _fill_payloads(self, rows: list[list[Any]]) -> None:
        """Read payload and opts of created/updated runs from their records: one
        lua/archive_records.lua call per shard (RECORDS_PER_CALL runs), all in one
        round trip."""
        by_shard: dict[int, list[list[Any]]] = {}
        for row in rows:
            if row[4] in ("created", "updated"):
                by_shard.setdefault(row[0], []).append(row)
        if not by_shard:
            return
        meta, script = self.store.keys.meta, self.store.scripts.archive_records
        chunks = [
            (shard, wanted[i : i + RECORDS_PER_CALL])
            for shard, wanted in by_shard.items()
            for i in range(0, len(wanted), RECORDS_PER_CALL)
        ]
        calls = [
            Call(script, [meta(shard)], [row[3] for row in chunk], _records)
            for shard, chunk in chunks
        ]
        replies = await self.store.run_many(calls)
        for (_, chunk), raws in zip(chunks, replies, strict=True):
            for row, raw in zip(chunk, raws, strict=True):
                if isinstance(raw, bytes):
                    values = record.decode_fields(raw)
                    row[7] = values[4]  # queue
                    row[14], row[15] = values[6], values[7]  # payload, opts

    async def _schedule_changes(
        self, rows: list[list[Any]]
    ) -> tuple[list[tuple[str, int, str | None, str]], list[str]]:
        """(upserts, deletes) of the `schedules` table for the schedule events in `rows`:
        each touched schedule's hash as it is now (newer than the event: fine, the table
        keeps the latest), or a delete when it is gone."""
        touched: dict[str, int] = {}
        for row in rows:
            if row[4] in SCHEDULE_EVENTS and row[3]:
                touched[row[3]] = row[0]
        if not touched:
            return [], []
        keys = self.store.keys
        pipe = self.store.client.pipeline(transaction=False)
        for sid, shard in touched.items():
            pipe.hgetall(keys.schedule(shard, sid))
        try:
            hashes: list[Any] = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"cannot read schedules: {exc}") from exc
        upserts, deletes = [], []
        for (sid, shard), raw in zip(touched.items(), hashes, strict=True):
            if not raw:
                deletes.append(sid)
                continue
            definition = {k.decode(): v.decode() for k, v in raw.items()}
            upserts.append((sid, shard, definition.get("tenant"), json.dumps(definition)))
        return upserts, deletes

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
        await self._fill_payloads(rows)
        upserts, deletes = await self._schedule_changes(rows)
        changes: dict[str, TaskChange] = {}
        for row in rows:
            if row[3] and row[4] not in SCHEDULE_EVENTS:
                changes.setdefault(row[3], TaskChange(shard=row[0])).apply(row)
        if tenant_position is not None:
            advanced[tenancy.LOG_SHARD] = tenant_position
        try:
            async with self.conn.transaction(), self.conn.cursor() as cur:
                await _store_rows(cur, rows, changes)
                if upserts:
                    await cur.executemany(_UPSERT_SCHEDULE, upserts)
                if deletes:
                    await cur.execute(
                        "DELETE FROM schedules WHERE schedule_id = ANY(%s)", (deletes,)
                    )
                await tenancy.write_tenants(cur, tenants)
                marks = [(s, *cp) for s, cp in advanced.items() if cp is not None]
                if marks:
                    await cur.execute(_UPSERT_CHECKPOINTS, _columns(marks))
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
