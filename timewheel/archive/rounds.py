"""One archive round's rows: what it reads from Redis beside the events (payloads of
created and updated runs, schedules' definitions) and what it writes to PostgreSQL in
its one transaction (run_events by COPY, the changed runs in one upsert, schedules,
tenants, checkpoints). timewheel/archive/archiver.py runs the rounds."""

from __future__ import annotations

import json
from typing import Any

import psycopg
from redis.exceptions import RedisError

from timewheel.archive import tenancy
from timewheel.archive.events import EVENT_COLUMNS, StreamId, TaskChange
from timewheel.errors import RedisUnavailable
from timewheel.store import record
from timewheel.store.shard import Store

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


async def fill_payloads(store: Store, rows: list[list[Any]]) -> None:
    """Read payload and opts of created/updated runs from their records: one
    lua/archive_records.lua call per shard and 1,000 runs (Store.records), all in one
    round trip."""
    wanted = [row for row in rows if row[4] in ("created", "updated")]
    if not wanted:
        return
    raws = await store.records([(row[0], row[3]) for row in wanted])
    for row, raw in zip(wanted, raws, strict=True):
        if raw is not None:
            values = record.decode_fields(raw)
            row[7] = values[4]  # queue
            row[14], row[15] = values[6], values[7]  # payload, opts


async def schedule_changes(
    store: Store, rows: list[list[Any]]
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
    keys = store.keys
    pipe = store.client.pipeline(transaction=False)
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


def task_changes(rows: list[list[Any]]) -> dict[str, TaskChange]:
    """The runs a round's rows change, each with its latest columns."""
    changes: dict[str, TaskChange] = {}
    for row in rows:
        if row[3] and row[4] not in SCHEDULE_EVENTS:
            changes.setdefault(row[3], TaskChange(shard=row[0])).apply(row)
    return changes


async def write(
    cur: psycopg.AsyncCursor[tuple[object, ...]],
    rows: list[list[Any]],
    *,
    schedules: tuple[list[tuple[str, int, str | None, str]], list[str]],
    tenants: list[tenancy.TenantCopy],
    marks: dict[int, StreamId | None],
) -> None:
    """Everything a round stores, inside the caller's transaction."""
    await _store_rows(cur, rows, task_changes(rows))
    upserts, deletes = schedules
    if upserts:
        await cur.executemany(_UPSERT_SCHEDULE, upserts)
    if deletes:
        await cur.execute("DELETE FROM schedules WHERE schedule_id = ANY(%s)", (deletes,))
    await tenancy.write_tenants(cur, tenants)
    checkpoints = [(s, *cp) for s, cp in marks.items() if cp is not None]
    if checkpoints:
        await cur.execute(_UPSERT_CHECKPOINTS, _columns(checkpoints))
