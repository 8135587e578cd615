"""Restore: rebuild an empty Redis from the newest snapshot plus the events archived after it.

First the tenants, their limits and the hashes of their live API keys
(timewheel/archive/tenancy.py). Then per shard: load the snapshot's runs, replay that
shard's run_events after the snapshot's position in order (each event sets absolute
values, see timewheel/archive/snapshot.py), and write
- the runs that end up pending (scheduled, or dispatched and not acknowledged) through
  lua/restore_runs.lua, which owns the record format and the wheel placement. Runs keep
  their ids, run ids, payloads and due times; a run that was dispatched but not
  acknowledged is dispatched again under the same run id (executors deduplicate by it);
- the dead-lettered runs, with a dead letter each (reason and last error as archived),
  and the succeeded and cancelled runs that finished within the retention window,
  through lua/restore_finished.lua: an idempotency key of a finished task still finds
  its task, and dispatch_expire.lua deletes the record when its retention ends.
Last the schedules, with their cursors. Every Lua call counts what it writes in the
tenant's usage hashes, so limits (max_pending, bytes, queues, schedules) hold at once.

`dry_run` reads PostgreSQL only and reports what a restore would write; `progress`
hears of each step (timewheel/archive/progress.py draws it for the CLI).

What is not restored: events Redis wrote after the archiver's last commit, and finished
records whose retention had ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncGenerator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import psycopg
import structlog
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from timewheel.archive import pg, tenancy
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
FINISHED = ("succeeded", "cancelled", "dead")


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
    reason: str | None = None
    """Why a dead run was buried (its `dead` event's reason)."""

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

    def finished_args(self, run_id: str) -> list[str | int]:
        """The 13 values lua/restore_finished.lua takes per run."""
        return [
            run_id,
            self.state,
            self.attempt,
            self.due_ms,
            self.tenant or "",
            self.queue or "",
            self.created_ms,
            self.payload or "null",
            self.opts or "",
            self.finished_ms,
            self.last_error or "",
            self.schedule_id or "",
            self.reason or "failed",
        ]

    @property
    def finished_ms(self) -> int:
        return self.created_ms if self.updated_ms is None else self.updated_ms


@dataclass(frozen=True, slots=True)
class ShardSummary:
    """What restore wrote (or, dry, would write) into one shard."""

    shard: int
    pending: int = 0
    finished: int = 0
    """Succeeded and cancelled runs within retention."""
    dead: int = 0
    events_replayed: int = 0
    existing: int = 0
    expired: int = 0
    """Finished runs left out: their retention had ended."""
    skipped_no_payload: int = 0


@dataclass(frozen=True, slots=True)
class RestoreResult:
    snapshot_id: int
    restored: int
    """Pending runs written."""
    existing: int
    events_replayed: int
    skipped_no_payload: int
    finished: int = 0
    dead: int = 0
    expired: int = 0
    schedules: int = 0
    tenants: int = 0
    keys: int = 0
    revoked_keys: int = 0
    """Revoked keys, left out."""
    seconds: float = 0.0
    dry_run: bool = False
    shards: Sequence[ShardSummary] = field(default_factory=tuple)

    def summary(self) -> str:
        """The one line the CLI ends with."""
        verb = "would restore" if self.dry_run else "restored"
        return (
            f"{verb} {self.restored} runs from snapshot {self.snapshot_id} "
            f"({self.finished} finished, {self.dead} dead letters, {self.schedules} schedules, "
            f"{self.tenants} tenants, {self.keys} keys; {self.events_replayed} events "
            f"replayed, {self.existing} already present, {self.expired} past retention, "
            f"{self.skipped_no_payload} skipped for lack of a payload) in {self.seconds:.1f} s"
        )


class Progress(Protocol):
    """Hears of restore's steps: `begin` with their number, `step` after each."""

    def begin(self, steps: int) -> None: ...
    def step(self, what: str, **counts: int) -> None: ...
    def end(self) -> None: ...


class _Quiet:
    def begin(self, steps: int) -> None:
        del steps

    def step(self, what: str, **counts: int) -> None:
        del what, counts

    def end(self) -> None:
        pass


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
        return  # neither in the snapshot nor created since: gone before it, nothing to do
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
        run.state, run.attempt, run.due_ms, run.reason = "scheduled", 0, at, None
    elif kind in ("cancelled", "acked", "dead"):
        run.state = {"cancelled": "cancelled", "acked": "succeeded", "dead": "dead"}[kind]
        if ev["error"] is not None:
            run.last_error = ev["error"]
        if kind == "dead":
            run.reason = ev["reason"]
            if ev["attempt"] is not None:
                run.attempt = ev["attempt"]


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


async def restore(
    settings: Settings,
    *,
    force: bool = False,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> RestoreResult:
    """Rebuild the deployment in `settings.redis_url` from `settings.postgres_dsn`.

    `dry_run`: read PostgreSQL only, write nothing (Redis is not even connected to),
    and return what a restore would write.

    Raises:
        RestoreRefused: Redis holds keys and `force` is false, or there is no snapshot.
        ConfigError: the snapshot was taken with another prefix, shard count or bucket width.
        PostgresUnavailable, RedisUnavailable: a server failed.
    """
    began = time.monotonic()
    steps = progress or _Quiet()
    cutoff_ms = int(time.time() * 1000) - settings.retention_ms
    try:
        async with pg.connection(settings.postgres_dsn) as conn:
            snapshot = await _newest_snapshot(conn, settings)
            archived = await tenancy.load(conn)
            steps.begin(settings.shards + 2)
            if dry_run:
                steps.step("tenants", tenants=len(archived.tenants), keys=len(archived.keys))
                shards = []
                for shard in range(settings.shards):
                    plan = await _plan_shard(conn, snapshot, shard, cutoff_ms)
                    shards.append(plan.summary(shard))
                    steps.step(f"shard {shard}", **_counts(shards[-1]))
                schedules = await _schedule_count(conn)
                steps.step("schedules", schedules=schedules)
            else:
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
                    await tenancy.write_back(client, store.keys, archived)
                    await _open_tenant_log(store, conn)
                    steps.step("tenants", tenants=len(archived.tenants), keys=len(archived.keys))
                    shards = []
                    plans = _plans(conn, snapshot, settings.shards, cutoff_ms)
                    async with contextlib.aclosing(plans):
                        async for shard, plan in plans:
                            done = await _restore_shard(store, conn, snapshot, shard, plan)
                            shards.append(done)
                            steps.step(f"shard {shard}", **_counts(done))
                    schedules = await write_schedule_hashes(store, conn, snapshot)
                    steps.step("schedules", schedules=schedules)
                finally:
                    await store.close()
    finally:
        steps.end()
    result = RestoreResult(
        snapshot,
        restored=sum(s.pending for s in shards),
        existing=sum(s.existing for s in shards),
        events_replayed=sum(s.events_replayed for s in shards),
        skipped_no_payload=sum(s.skipped_no_payload for s in shards),
        finished=sum(s.finished for s in shards),
        dead=sum(s.dead for s in shards),
        expired=sum(s.expired for s in shards),
        schedules=schedules,
        tenants=len(archived.tenants),
        keys=len(archived.keys),
        revoked_keys=archived.revoked,
        seconds=time.monotonic() - began,
        dry_run=dry_run,
        shards=tuple(shards),
    )
    log.info(
        "restore_planned" if dry_run else "restored",
        snapshot_id=snapshot,
        runs=result.restored,
        finished=result.finished,
        dead=result.dead,
        schedules=result.schedules,
        tenants=result.tenants,
        keys=result.keys,
        existing=result.existing,
        events_replayed=result.events_replayed,
        skipped_no_payload=result.skipped_no_payload,
        seconds=round(result.seconds, 3),
    )
    return result


def _counts(s: ShardSummary) -> dict[str, int]:
    return {"pending": s.pending, "finished": s.finished, "dead": s.dead}


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


@dataclass(slots=True)
class _ShardPlan:
    """A shard's runs after the replay, sorted by what restore does with them."""

    pending: list[tuple[str, RestoredRun]]
    finished: list[tuple[str, RestoredRun]]
    replayed: int
    expired: int
    no_payload: list[str]

    def summary(self, shard: int) -> ShardSummary:
        """What a restore would write (dry run)."""
        dead = sum(1 for _, run in self.finished if run.state == "dead")
        return self.written(shard, len(self.pending), len(self.finished) - dead, dead, 0)

    def written(
        self, shard: int, pending: int, finished: int, dead: int, existing: int
    ) -> ShardSummary:
        return ShardSummary(
            shard,
            pending=pending,
            finished=finished,
            dead=dead,
            events_replayed=self.replayed,
            existing=existing,
            expired=self.expired,
            skipped_no_payload=len(self.no_payload),
        )


async def _plan_shard(
    conn: psycopg.AsyncConnection[tuple[object, ...]], snapshot: int, shard: int, cutoff_ms: int
) -> _ShardPlan:
    """Load the snapshot's runs of a shard and replay its events after the snapshot."""
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
    with_payload = {rid: run for rid, run in runs.items() if run.payload is not None}
    no_payload = [rid for rid, run in runs.items() if run.payload is None and run.state in PENDING]
    if no_payload:
        log.warning("restore_skipped_no_payload", shard=shard, runs=no_payload[:20])
    pending = [(rid, run) for rid, run in with_payload.items() if run.state in PENDING]
    finished, expired = [], 0
    for rid, run in with_payload.items():
        if run.state == "dead":
            finished.append((rid, run))
        elif run.state in FINISHED:
            if run.finished_ms >= cutoff_ms:
                finished.append((rid, run))
            else:
                expired += 1
    unknown = {rid: run for rid, run in finished if run.state == "dead" and run.reason is None}
    await _dead_reasons(conn, shard, unknown)
    return _ShardPlan(pending, finished, replayed, expired, no_payload)


async def _dead_reasons(
    conn: psycopg.AsyncConnection[tuple[object, ...]], shard: int, dead: dict[str, RestoredRun]
) -> None:
    """Fill in why each dead run was buried from its last archived `dead` event (the
    record holds no reason: a run buried before the snapshot has it in run_events only)."""
    if not dead:
        return
    cur = await conn.execute(
        "SELECT DISTINCT ON (run_id) run_id, reason FROM run_events"
        " WHERE shard = %s AND kind = 'dead' AND run_id = ANY(%s)"
        " ORDER BY run_id, id_ms DESC, id_seq DESC",
        (shard, list(dead)),
    )
    async for rid, reason in cur:
        if reason is not None:
            dead[str(rid)].reason = str(reason)


async def _plans(
    conn: psycopg.AsyncConnection[tuple[object, ...]], snapshot: int, shards: int, cutoff_ms: int
) -> AsyncGenerator[tuple[int, _ShardPlan], None]:
    """Every shard's plan, in order, the next one read from PostgreSQL while the caller
    writes this one into Redis (the two servers work at once; the connection runs one
    statement at a time, so its statements only interleave)."""
    ahead: asyncio.Task[_ShardPlan] | None = None
    try:
        for shard in range(shards):
            plan = await (ahead or _plan_shard(conn, snapshot, shard, cutoff_ms))
            ahead = None
            if shard + 1 < shards:
                ahead = asyncio.create_task(_plan_shard(conn, snapshot, shard + 1, cutoff_ms))
            yield shard, plan
    finally:
        if ahead is not None:
            ahead.cancel()
            with contextlib.suppress(asyncio.CancelledError, psycopg.Error):
                await ahead


async def _restore_shard(
    store: Store,
    conn: psycopg.AsyncConnection[tuple[object, ...]],
    snapshot: int,
    shard: int,
    plan: _ShardPlan,
) -> ShardSummary:
    written, existing = await _write(store, shard, plan.pending)
    dead = [(rid, run) for rid, run in plan.finished if run.state == "dead"]
    done = [(rid, run) for rid, run in plan.finished if run.state != "dead"]
    dead_written, dead_existing = await _write(store, shard, dead, finished=True)
    done_written, done_existing = await _write(store, shard, done, finished=True)
    await _mark_restored(store, conn, snapshot, shard, written)
    existing += dead_existing + done_existing
    return plan.written(shard, written, done_written, dead_written, existing)


async def _open_tenant_log(store: Store, conn: psycopg.AsyncConnection[tuple[object, ...]]) -> None:
    """The tenant change log's first entry, past the archiver's checkpoint (as each
    shard's event log: see _mark_restored)."""
    cur = await conn.execute(
        "SELECT last_ms, last_seq FROM archive_checkpoints WHERE shard = %s",
        (tenancy.LOG_SHARD,),
    )
    row = await cur.fetchone()
    await _open_log(store, store.keys.tenant_log(), row, {"e": "restored"})


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
    fields = {"e": "restored", "snapshot": snapshot, "runs": written}
    await _open_log(store, store.keys.events(shard), row, fields)


async def _open_log(
    store: Store, key: str, checkpoint: tuple[object, ...] | None, fields: dict[str, Any]
) -> None:
    client = store.client
    try:
        sec, usec = await client.time()
        now_ms = int(sec) * 1000 + int(usec) // 1000
        entry_id = "*"
        if checkpoint is not None and int(str(checkpoint[0])) >= now_ms:
            entry_id = f"{int(str(checkpoint[0]))}-{int(str(checkpoint[1])) + 1}"
        await client.xadd(key, {**fields, "at": now_ms}, id=entry_id)  # type: ignore[dict-item]
    except (RedisError, OSError) as exc:
        raise RedisUnavailable(f"cannot open the log {key}: {exc}") from exc


async def _write(
    store: Store,
    shard: int,
    pending: Iterable[tuple[str, RestoredRun]],
    *,
    finished: bool = False,
) -> tuple[int, int]:
    """Write runs through lua/restore_runs.lua (pending ones) or lua/restore_finished.lua,
    RUNS_PER_CALL per call, CALLS_PER_PIPELINE calls per round trip (each call stays
    short; the pipeline only saves round trips). One pipeline is in flight while the
    next is built, so Redis runs scripts while Python packs arguments."""
    scripts = store.scripts
    script = scripts.restore_finished if finished else scripts.restore_runs
    keys = [store.keys.meta(shard)]
    calls: list[Call[tuple[int, int]]] = []
    group: list[ScriptArg] = []
    count = written = existing = 0
    inflight: asyncio.Task[list[tuple[int, int]]] | None = None

    async def settle() -> None:
        nonlocal written, existing, inflight
        if inflight is not None:
            for one_written, one_existing in await inflight:
                written += one_written
                existing += one_existing
            inflight = None

    async def send() -> None:
        nonlocal calls, inflight
        await settle()
        inflight = asyncio.create_task(store.run_many(calls))
        calls = []

    try:
        for run_id, run in pending:
            group.extend(run.finished_args(run_id) if finished else run.args(run_id))
            count += 1
            if count == RUNS_PER_CALL:
                calls.append(
                    Call(script, keys, [store.settings.bucket_ms, count, *group], _restored)
                )
                group, count = [], 0
                if len(calls) == CALLS_PER_PIPELINE:
                    await send()
        if count:
            calls.append(Call(script, keys, [store.settings.bucket_ms, count, *group], _restored))
        if calls:
            await send()
        await settle()
    finally:
        if inflight is not None:  # an error: the pipeline's outcome no longer matters
            inflight.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await inflight
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


async def _schedule_count(conn: psycopg.AsyncConnection[tuple[object, ...]]) -> int:
    try:
        cur = await conn.execute("SELECT count(*) FROM schedules")
        row = await cur.fetchone()
    except psycopg.Error as exc:
        raise PostgresUnavailable(f"cannot count archived schedules: {exc}") from exc
    return int(str(row[0])) if row else 0


def _schedule_restored(reply: list[Any]) -> int:
    """restore_schedule.lua's reply: 1 if the schedule was written."""
    return int(reply[0])
