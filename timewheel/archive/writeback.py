"""Restore's writing into Redis: a shard's planned runs, the logs' first entries and
the schedules.

The pending runs go through lua/restore_runs.lua, which owns the record format and the
wheel placement: runs keep their ids, run ids, payloads and due times; a run that was
dispatched but not acknowledged is dispatched again under the same run id (executors
deduplicate by it). The dead-lettered runs (with a dead letter each: reason and last
error as archived) and the finished ones within retention go through
lua/restore_finished.lua: an idempotency key of a finished task still finds its task, and
dispatch_expire.lua deletes the record when its retention ends. Every Lua call counts
what it writes in the tenant's usage hashes, so limits hold at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterable
from typing import Any

import psycopg
import structlog
from redis.exceptions import RedisError

from timewheel.archive import tenancy
from timewheel.archive.replay import RestoredRun, ShardPlan, ShardSummary
from timewheel.errors import PostgresUnavailable, RedisUnavailable
from timewheel.store.library import ScriptArg
from timewheel.store.shard import Call, Store

log = structlog.get_logger("timewheel.restore")

RUNS_PER_CALL = 200
"""Runs per restore_runs.lua call (its header's limit)."""
CALLS_PER_PIPELINE = 16


async def restore_shard(
    store: Store,
    conn: psycopg.AsyncConnection[tuple[object, ...]],
    snapshot: int,
    shard: int,
    plan: ShardPlan,
) -> ShardSummary:
    written, existing = await write_runs(store, shard, plan.pending)
    dead = [(rid, run) for rid, run in plan.finished if run.state == "dead"]
    done = [(rid, run) for rid, run in plan.finished if run.state != "dead"]
    dead_written, dead_existing = await write_runs(store, shard, dead, finished=True)
    done_written, done_existing = await write_runs(store, shard, done, finished=True)
    await mark_restored(store, conn, snapshot, shard, written)
    existing += dead_existing + done_existing
    return plan.written(shard, written, done_written, dead_written, existing)


async def open_tenant_log(store: Store, conn: psycopg.AsyncConnection[tuple[object, ...]]) -> None:
    """The tenant change log's first entry, past the archiver's checkpoint (as each
    shard's event log: see mark_restored)."""
    cur = await conn.execute(
        "SELECT last_ms, last_seq FROM archive_checkpoints WHERE shard = %s",
        (tenancy.LOG_SHARD,),
    )
    row = await cur.fetchone()
    await _open_log(store, store.keys.tenant_log(), row, {"e": "restored"})


async def mark_restored(
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


async def write_runs(
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


def _schedule_restored(reply: list[Any]) -> int:
    """restore_schedule.lua's reply: 1 if the schedule was written."""
    return int(reply[0])
