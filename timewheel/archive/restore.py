"""Restore: rebuild an empty Redis from the newest snapshot plus the events archived after it.

Per shard: load the snapshot's runs, replay that shard's run_events after the snapshot's
position in order (each event sets absolute values, see timewheel/archive/snapshot.py), and
write the runs that end up pending (scheduled, or dispatched and not acknowledged)
through lua/restore_runs.lua, which owns the record format and the wheel placement. Runs
keep their ids, run ids, payloads and due times; a run that was dispatched but not
acknowledged is dispatched again under the same run id (executors deduplicate by it).

What is not restored: finished records (succeeded, cancelled: so an idempotency key of
a finished task no longer dedupes), dead letters (their history is in run_events), and
events Redis wrote after the archiver's last commit.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg
import structlog
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from timewheel.archive import pg
from timewheel.archive.events import EVENT_COLUMNS
from timewheel.config import Settings
from timewheel.errors import ConfigError, PostgresUnavailable, RedisUnavailable, RestoreRefused
from timewheel.store import deployment
from timewheel.store.connection import RedisClient, connect
from timewheel.store.library import ScriptArg
from timewheel.store.shard import Call, Store

log = structlog.get_logger("timewheel.restore")

RUNS_PER_CALL = 200
"""Runs per restore_runs.lua call (its header's limit)."""
CALLS_PER_PIPELINE = 16
PENDING = ("scheduled", "dispatched")


@dataclass(slots=True)
class RestoredRun:
    """A run as the snapshot and the events after it leave it."""

    state: str
    attempt: int
    due_ms: int
    tenant: str | None
    queue: str | None
    created_ms: int
    payload: str | None
    opts: str | None = None
    updated_ms: int | None = None
    last_error: str | None = None
    schedule_id: str | None = None

    def args(self, run_id: str) -> list[str | int]:
        """The 11 values lua/restore_runs.lua takes per run."""
        return [
            run_id,
            self.attempt,
            self.due_ms,
            self.tenant or "",
            self.queue or "",
            self.created_ms,
            self.payload or "null",
            self.opts or "",
            "" if self.updated_ms is None else self.updated_ms,
            self.last_error or "",
            self.schedule_id or "",
        ]


@dataclass(frozen=True, slots=True)
class RestoreResult:
    snapshot_id: int
    restored: int
    existing: int
    events_replayed: int
    skipped_no_payload: int


def apply_event(runs: dict[str, RestoredRun], ev: dict[str, Any]) -> None:
    """Replay one run_events row onto the runs of a shard."""
    run_id, kind, at = ev["run_id"], ev["kind"], ev["at_ms"]
    if kind == "created":
        runs[run_id] = RestoredRun(
            state="scheduled",
            attempt=0,
            due_ms=ev["due_ms"],
            tenant=ev["tenant"],
            queue=ev["queue"],
            created_ms=at,
            payload=ev["payload"],
            opts=ev["opts"],
        )
        return
    run = runs.get(run_id)
    if run is None:
        return  # not pending at the snapshot and not created since: nothing to restore
    if kind == "purged":
        del runs[run_id]
        return
    run.updated_ms = at
    if kind == "updated":
        run.due_ms = ev["due_ms"] if ev["due_ms"] is not None else run.due_ms
        run.payload = ev["payload"] if ev["payload"] is not None else run.payload
    elif kind == "dispatched":
        run.state, run.attempt = "dispatched", ev["attempt"]
    elif kind == "retry_scheduled":
        run.state, run.attempt, run.due_ms = "scheduled", ev["attempt"], ev["due_ms"]
        run.last_error = ev["error"]
    elif kind == "replayed":
        run.state, run.attempt, run.due_ms = "scheduled", 0, at
    elif kind in ("cancelled", "acked", "dead"):
        run.state = {"cancelled": "cancelled", "acked": "succeeded", "dead": "dead"}[kind]
        if ev["error"] is not None:
            run.last_error = ev["error"]


async def _key_count(client: RedisClient) -> int:
    """Keys in the server, or in every primary of a Cluster."""
    try:
        if isinstance(client, RedisCluster):
            total = 0
            for node in client.get_primaries():
                total += int(await client.dbsize(target_nodes=node))
            return total
        return int(await client.dbsize())
    except (RedisError, OSError) as exc:
        raise RedisUnavailable(f"cannot count keys: {exc}") from exc


async def restore(settings: Settings, *, force: bool = False) -> RestoreResult:
    """Rebuild the deployment in `settings.redis_url` from `settings.postgres_dsn`.

    Raises:
        RestoreRefused: Redis holds keys and `force` is false, or there is no snapshot.
        ConfigError: the snapshot was taken with another prefix, shard count or bucket width.
        PostgresUnavailable, RedisUnavailable: a server failed.
    """
    async with pg.connection(settings.postgres_dsn) as conn:
        snapshot = await _newest_snapshot(conn, settings)
        client = await connect(settings.redis_url)
        store = Store(client, settings)
        try:
            keys = await _key_count(client)
            if keys and not force:
                raise RestoreRefused(
                    f"Redis at {settings.redis_url} is not empty ({keys} keys); restore "
                    "writes into an empty Redis only (pass --force to add the snapshot's "
                    "runs to it, leaving runs already there untouched)"
                )
            await deployment.ensure_layout(client, settings)
            totals = [0, 0, 0, 0]
            for shard in range(settings.shards):
                done = await _restore_shard(store, conn, snapshot, shard)
                totals = [a + b for a, b in zip(totals, done, strict=True)]
            await write_schedule_hashes(store, conn, snapshot)
        finally:
            await store.close()
    result = RestoreResult(snapshot, *totals)
    log.info(
        "restored",
        snapshot_id=snapshot,
        runs=result.restored,
        existing=result.existing,
        events_replayed=result.events_replayed,
        skipped_no_payload=result.skipped_no_payload,
    )
    return result


async def _newest_snapshot(conn: psycopg.AsyncConnection[tuple[object, ...]], s: Settings) -> int:
    try:
        cur = await conn.execute(
            "SELECT snapshot_id, prefix, shards, bucket_ms FROM snapshots"
            " WHERE finished_at IS NOT NULL ORDER BY snapshot_id DESC LIMIT 1"
        )
    except psycopg.errors.UndefinedTable:
        raise RestoreRefused(
            "the PostgreSQL database has no timewheel tables: run the archiver and take a "
            "snapshot first"
        ) from None
    row = await cur.fetchone()
    if row is None:
        raise RestoreRefused("no complete snapshot in PostgreSQL: run `timewheel snapshot` first")
    snapshot_id, prefix, shards, bucket_ms = (str(v) for v in row)
    if (prefix, int(shards), int(bucket_ms)) != (s.prefix, s.shards, s.bucket_ms):
        raise ConfigError(
            f"snapshot {snapshot_id} is of prefix {prefix!r}, {shards} shards, bucket_ms "
            f"{bucket_ms}; the settings say {s.prefix!r}, {s.shards}, {s.bucket_ms}"
        )
    return int(snapshot_id)


async def _restore_shard(
    store: Store, conn: psycopg.AsyncConnection[tuple[object, ...]], snapshot: int, shard: int
) -> list[int]:
    runs: dict[str, RestoredRun] = {}
    cur = await conn.execute(
        "SELECT run_id, state, attempt, due_ms, tenant, queue, created_ms, payload, opts,"
        " updated_ms, last_error, schedule_id FROM snapshot_tasks"
        " WHERE snapshot_id = %s AND shard = %s",
        (snapshot, shard),
    )
    async for r in cur:
        runs[str(r[0])] = RestoredRun(*r[1:])  # type: ignore[arg-type]
    cur = await conn.execute(
        "SELECT from_ms, from_seq FROM snapshot_shards WHERE snapshot_id = %s AND shard = %s",
        (snapshot, shard),
    )
    position = await cur.fetchone()
    if position is None:
        raise RestoreRefused(f"snapshot {snapshot} has no position for shard {shard}")
    cur = await conn.execute(
        f"SELECT {', '.join(EVENT_COLUMNS)} FROM run_events"
        " WHERE shard = %s AND (id_ms, id_seq) > (%s, %s) ORDER BY id_ms, id_seq, run_id",
        (shard, position[0], position[1]),
    )
    replayed = 0
    async for row in cur:
        apply_event(runs, dict(zip(EVENT_COLUMNS, row, strict=True)))
        replayed += 1
    pending = [(rid, run) for rid, run in runs.items() if run.state in PENDING]
    no_payload = [rid for rid, run in pending if run.payload is None]
    if no_payload:
        log.warning("restore_skipped_no_payload", shard=shard, runs=no_payload[:20])
    written, existing = await _write(store, shard, (p for p in pending if p[1].payload is not None))
    await _mark_restored(store, conn, snapshot, shard, written)
    return [written, existing, replayed, len(no_payload)]


async def _mark_restored(
    store: Store,
    conn: psycopg.AsyncConnection[tuple[object, ...]],
    snapshot: int,
    shard: int,
    written: int,
) -> None:
    """Open the shard's new event log with a `restored` entry whose id is past the
    archiver's checkpoint. Stream ids come from the Redis clock: if the new server's
    clock were behind the old one's, its events would get ids at or below the checkpoint
    and the archiver, which reads after the checkpoint, would skip them. Every id in
    the new log is now above it whatever the clock says."""
    cur = await conn.execute(
        "SELECT last_ms, last_seq FROM archive_checkpoints WHERE shard = %s", (shard,)
    )
    row = await cur.fetchone()
    client, key = store.client, store.keys.events(shard)
    try:
        sec, usec = await client.time()
        now_ms = int(sec) * 1000 + int(usec) // 1000
        entry_id = "*"
        if row is not None and int(str(row[0])) >= now_ms:
            entry_id = f"{int(str(row[0]))}-{int(str(row[1])) + 1}"
        fields = {"e": "restored", "snapshot": snapshot, "runs": written, "at": now_ms}
        await client.xadd(key, fields, id=entry_id)  # type: ignore[arg-type]
    except (RedisError, OSError) as exc:
        raise RedisUnavailable(f"cannot write the restored event of shard {shard}: {exc}") from exc


async def _write(
    store: Store, shard: int, pending: Iterable[tuple[str, RestoredRun]]
) -> tuple[int, int]:
    """Write runs through lua/restore_runs.lua, RUNS_PER_CALL per call, CALLS_PER_PIPELINE calls
    per round trip (each call stays short; the pipeline only saves round trips)."""
    script, keys = store.scripts.restore_runs, [store.keys.meta(shard)]
    calls: list[Call[tuple[int, int]]] = []
    group: list[ScriptArg] = []
    count = written = existing = 0

    async def send() -> None:
        nonlocal written, existing, calls
        for one_written, one_existing in await store.run_many(calls):
            written += one_written
            existing += one_existing
        calls = []

    for run_id, run in pending:
        group.extend(run.args(run_id))
        count += 1
        if count == RUNS_PER_CALL:
            calls.append(Call(script, keys, [store.settings.bucket_ms, count, *group], _restored))
            group, count = [], 0
            if len(calls) == CALLS_PER_PIPELINE:
                await send()
    if count:
        calls.append(Call(script, keys, [store.settings.bucket_ms, count, *group], _restored))
    if calls:
        await send()
    return written, existing


def _restored(reply: list[Any]) -> tuple[int, int]:
    """restore_runs.lua's reply: (written, existing)."""
    return int(reply[0]), int(reply[1])


async def write_schedule_hashes(
    store: Store, conn: psycopg.AsyncConnection[tuple[object, ...]], snapshot_id: int
) -> int:
    """Write the archive's schedules back into Redis (restore); returns how many.

    The `schedules` table holds each schedule as the archiver last read it (on any
    schedule event), or as the newest snapshot copied it: so a schedule created after the
    snapshot comes back too, and a deleted one does not. Each goes through
    lua/restore_schedule.lua, which plans it again from its last fire time sent.
    """
    del snapshot_id  # the table is newer than any snapshot
    try:
        cur = await conn.execute("SELECT schedule_id, shard, definition FROM schedules")
        rows = await cur.fetchall()
    except psycopg.Error as exc:
        raise PostgresUnavailable(f"cannot read archived schedules: {exc}") from exc
    written = 0
    for sid, shard, definition in rows:
        fields = definition if isinstance(definition, dict) else json.loads(str(definition))
        flat = [str(x) for kv in fields.items() for x in kv]
        call = Call(
            store.scripts.restore_schedule,
            [store.keys.schedule(int(str(shard)), str(sid))],
            [str(sid), json.dumps(flat)],
            _schedule_restored,
        )
        written += await store.run(call)
    log.info("schedules_restored", schedules=written)
    return written


def _schedule_restored(reply: list[Any]) -> int:
    """restore_schedule.lua's reply: 1 if the schedule was written."""
    return int(reply[0])
