"""Restore's reading of the archive: each shard's runs as the newest snapshot and the
events archived after it leave them.

A shard's plan loads the snapshot's runs of the shard, replays its run_events after the
snapshot's position in order (each event sets absolute values, see
timewheel/archive/snapshot.py), and sorts the runs by what restore writes: the pending
ones (scheduled, or dispatched and not acknowledged), the dead-lettered ones, and the
succeeded and cancelled ones that finished within the retention window. It reads
PostgreSQL only, so a dry run is the plans' summaries.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import psycopg
import structlog

from timewheel.archive.events import EVENT_COLUMNS
from timewheel.config import Settings
from timewheel.errors import ConfigError, PostgresUnavailable, RestoreRefused

log = structlog.get_logger("timewheel.restore")

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


async def newest_snapshot(conn: psycopg.AsyncConnection[tuple[object, ...]], s: Settings) -> int:
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
class ShardPlan:
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


async def plan_shard(
    conn: psycopg.AsyncConnection[tuple[object, ...]], snapshot: int, shard: int, cutoff_ms: int
) -> ShardPlan:
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
    await dead_reasons(conn, shard, unknown)
    return ShardPlan(pending, finished, replayed, expired, no_payload)


async def dead_reasons(
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


async def plans(
    conn: psycopg.AsyncConnection[tuple[object, ...]], snapshot: int, shards: int, cutoff_ms: int
) -> AsyncGenerator[tuple[int, ShardPlan], None]:
    """Every shard's plan, in order, the next one read from PostgreSQL while the caller
    writes this one into Redis (the two servers work at once; the connection runs one
    statement at a time, so its statements only interleave)."""
    ahead: asyncio.Task[ShardPlan] | None = None
    try:
        for shard in range(shards):
            plan = await (ahead or plan_shard(conn, snapshot, shard, cutoff_ms))
            ahead = None
            if shard + 1 < shards:
                ahead = asyncio.create_task(plan_shard(conn, snapshot, shard + 1, cutoff_ms))
            yield shard, plan
    finally:
        if ahead is not None:
            ahead.cancel()
            with contextlib.suppress(asyncio.CancelledError, psycopg.Error):
                await ahead


async def schedule_count(conn: psycopg.AsyncConnection[tuple[object, ...]]) -> int:
    try:
        cur = await conn.execute("SELECT count(*) FROM schedules")
        row = await cur.fetchone()
    except psycopg.Error as exc:
        raise PostgresUnavailable(f"cannot count archived schedules: {exc}") from exc
    return int(str(row[0])) if row else 0
