"""Snapshots: a copy of every run record (pending, dead, and finished within retention),
every schedule, and every tenant and API key hash into PostgreSQL, read in small steps.

Per shard the snapshot first reads the event log's newest entry id (the shard's position),
then copies the run records with HSCAN of each body hash, walked by position so a hash
that splits meanwhile is neither missed nor read twice (timewheel/store/bodies.py): a
listpack-sized hash answers in one short call, so Redis is never blocked for more than
about a millisecond at a time.
The copy is not a point-in-time image of the shard, and need not be: every change made
after the position is in the event log after it, which the archiver stores in
run_events. Restore replays those events, in order, on top of the copied records, and
each event sets absolute values (state, attempt, due time), so the result is the state
at the last archived event (redo from a fuzzy checkpoint).

Tenants and keys are copied by timewheel/archive/tenancy.py (global keys, HSCAN).

The whole snapshot is one PostgreSQL transaction: a snapshot that died half way leaves
nothing behind, and `finished_at` marks the complete ones.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import structlog
from redis.exceptions import RedisError

from timewheel.archive import tenancy
from timewheel.errors import PostgresUnavailable, RedisUnavailable
from timewheel.store import bodies, record
from timewheel.store.bodies import BodyHash, BodyLayout
from timewheel.store.shard import Call, Store
from timewheel.types import TaskState

log = structlog.get_logger("timewheel.snapshot")

HSCAN_COUNT = 1000
"""Fields per HSCAN step of a hashtable-encoded body (a listpack one answers whole)."""
KEYS_PER_ROUND_TRIP = 512
"""Body hashes asked for in one pipeline (store/bodies.py: about 64 records each in a
shard that has grown): bounds the memory of a step, not Redis time: each HSCAN is its
own command."""
SENT_PER_CALL = 500
"""Run ids per lua/snapshot_sent.lua call (its header's limit)."""
KEEP_SNAPSHOTS = 3
"""Complete snapshots kept; older ones are deleted by the snapshot that completes."""
SNAPSHOT_STATES = (
    TaskState.SCHEDULED,
    TaskState.DISPATCHED,
    TaskState.DEAD,
    TaskState.SUCCEEDED,
    TaskState.CANCELLED,
)
"""Copied states: pending runs, dead ones (their dead letters; a later `replayed` event
brings them back), and finished ones (Redis keeps those for the retention window only:
their idempotency keys still dedupe after a restore)."""

TASK_COLUMNS = (
    "snapshot_id",
    "shard",
    "run_id",
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
    "schedule_id",
)


@dataclass(frozen=True, slots=True)
class ScheduleCopy:
    """One schedule hash as read from Redis."""

    schedule_id: str
    tenant: str | None
    definition: dict[str, str]


@dataclass(frozen=True, slots=True)
class SnapshotResult:
    snapshot_id: int
    tasks: int
    schedules: int
    tenants: int = 0
    keys: int = 0


async def read_schedule_hashes(store: Store, shard: int) -> list[ScheduleCopy]:
    """Every schedule of one shard as stored in Redis: the shard's schedule index read in
    steps of 200 (SSCAN), each step's hashes in one pipeline."""
    client, keys = store.client, store.keys
    out: list[ScheduleCopy] = []
    cursor = 0
    try:
        while True:
            next_cursor, members = await client.sscan(keys.schedules(shard), cursor, count=200)
            cursor = int(next_cursor)
            sids = [m.decode() if isinstance(m, bytes) else str(m) for m in members]
            if sids:
                pipe = client.pipeline(transaction=False)
                for sid in sids:
                    pipe.hgetall(keys.schedule(shard, sid))
                hashes: list[Any] = await pipe.execute()
                out.extend(
                    _schedule_copy(sid, raw) for sid, raw in zip(sids, hashes, strict=True) if raw
                )
            if int(cursor) == 0:
                return out
    except (RedisError, OSError) as exc:
        raise RedisUnavailable(f"cannot read the schedules of shard {shard}: {exc}") from exc


def _schedule_copy(sid: str, raw: dict[bytes, bytes]) -> ScheduleCopy:
    definition = {k.decode(): v.decode() for k, v in raw.items()}
    return ScheduleCopy(sid, definition.get("tenant"), definition)


async def _position(store: Store, shard: int) -> tuple[int, int]:
    """The id of the newest entry in the shard's event log, (0, 0) if there is none."""
    try:
        last: Any = await store.client.xrevrange(store.keys.events(shard), count=1)
    except (RedisError, OSError) as exc:
        raise RedisUnavailable(f"cannot read the event log of shard {shard}: {exc}") from exc
    if not last:
        return 0, 0
    ms, _, seq = last[0][0].decode().partition("-")
    return int(ms), int(seq)


async def _scan_bodies(
    store: Store, shard: int, hashes: Sequence[BodyHash]
) -> list[tuple[str, bytes]]:
    """Every (run id, record) of the given body hashes, one HSCAN step per key per round."""
    out: list[tuple[str, bytes]] = []
    cursors = {h: 0 for h in hashes}
    while cursors:
        pipe = store.client.pipeline(transaction=False)
        for h, cursor in cursors.items():
            pipe.hscan(h.key, cursor, count=HSCAN_COUNT)
        try:
            replies: list[Any] = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"cannot scan the records of shard {shard}: {exc}") from exc
        following: dict[BodyHash, int] = {}
        for h, (cursor, fields) in zip(cursors, replies, strict=True):
            out.extend((h.run_id(shard, f.decode()), raw) for f, raw in fields.items())
            if int(cursor):
                following[h] = int(cursor)
        cursors = following
    return out


async def _scan_round(
    store: Store, shard: int, layout: BodyLayout, position: int
) -> tuple[BodyLayout, int, list[tuple[str, bytes]]]:
    """The records of the next KEYS_PER_ROUND_TRIP body hashes from `position`, the
    layout they were read by and the position after them. A hash that split while they
    were read (the layout after them is another) has the round read again by the new
    layout (store/bodies.py)."""
    while True:
        hashes: list[BodyHash] = []
        for h in layout.walk(store.keys.tag(shard), position):
            hashes.append(h)
            if len(hashes) == KEYS_PER_ROUND_TRIP:
                break
        found = await _scan_bodies(store, shard, hashes)
        current = await store.body_layout(shard)
        if current == layout:
            return layout, hashes[-1].next_position, found
        layout = current


async def _sent(store: Store, shard: int, waiting: list[str]) -> set[str]:
    """The run ids of `waiting` (runs whose records said scheduled) that were sent, so
    are dispatched (lua/snapshot_sent.lua, record_sent as every script uses it):
    SENT_PER_CALL runs per call, all calls of a step in one round trip."""
    calls = [
        Call(store.scripts.snapshot_sent, [store.keys.meta(shard)], list(chunk), _positions)
        for chunk in (waiting[i : i + SENT_PER_CALL] for i in range(0, len(waiting), SENT_PER_CALL))
    ]
    if not calls:
        return set()
    sent: set[str] = set()
    for call, positions in zip(calls, await store.run_many(calls), strict=True):
        sent.update(str(call.args[p - 1]) for p in positions)
    return sent


def _positions(reply: list[Any]) -> list[int]:
    """snapshot_sent.lua's reply: 1-based positions of the sent runs."""
    return [int(p) for p in reply]


def row_of(snapshot_id: int, shard: int, run_id: str, v: list[Any]) -> tuple[Any, ...]:
    """The snapshot_tasks row of a record's values (after `sent` is applied)."""
    return (
        snapshot_id,
        shard,
        run_id,
        v[3],
        v[4],
        TaskState(v[0]).label,
        v[1],
        v[2],
        v[5],
        v[8],
        v[6],
        v[7],
        v[9],
        v[10],
    )


async def take_snapshot(
    store: Store,
    conn: psycopg.AsyncConnection[tuple[object, ...]],
    *,
    keep: int = KEEP_SNAPSHOTS,
) -> SnapshotResult:
    """Copy every pending run and schedule of the deployment into PostgreSQL.

    Raises:
        RedisUnavailable: Redis failed while reading.
        PostgresUnavailable: a statement failed (nothing of this snapshot is kept).
    """
    s = store.settings
    tasks = schedules = 0
    try:
        async with conn.transaction(), conn.cursor() as cur:
            await cur.execute(
                "INSERT INTO snapshots (prefix, shards, bucket_ms) VALUES (%s, %s, %s)"
                " RETURNING snapshot_id",
                (s.prefix, s.shards, s.bucket_ms),
            )
            row = await cur.fetchone()
            assert row is not None
            snapshot_id = int(str(row[0]))
            for shard in range(s.shards):
                position = await _position(store, shard)
                await cur.execute(
                    "INSERT INTO snapshot_shards (snapshot_id, shard, from_ms, from_seq)"
                    " VALUES (%s, %s, %s, %s)",
                    (snapshot_id, shard, *position),
                )
                tasks += await _copy_tasks(store, cur, snapshot_id, shard)
                schedules += await _copy_schedules(store, cur, snapshot_id, shard)
            tenants, keys = await tenancy.copy_all(store.client, store.keys, cur)
            await cur.execute(
                "UPDATE snapshots SET finished_at = now(), tasks = %s, schedules = %s"
                " WHERE snapshot_id = %s",
                (tasks, schedules, snapshot_id),
            )
            await cur.execute(
                "DELETE FROM snapshots WHERE finished_at IS NOT NULL AND snapshot_id NOT IN"
                " (SELECT snapshot_id FROM snapshots WHERE finished_at IS NOT NULL"
                "  ORDER BY snapshot_id DESC LIMIT %s)",
                (max(1, keep),),
            )
    except psycopg.Error as exc:
        raise PostgresUnavailable(f"snapshot failed: {exc}") from exc
    log.info(
        "snapshot_taken",
        snapshot_id=snapshot_id,
        tasks=tasks,
        schedules=schedules,
        tenants=tenants,
        keys=keys,
    )
    return SnapshotResult(snapshot_id, tasks, schedules, tenants, keys)


async def _copy_tasks(
    store: Store, cur: psycopg.AsyncCursor[tuple[object, ...]], snapshot_id: int, shard: int
) -> int:
    count = 0
    copied = {int(state) for state in SNAPSHOT_STATES}
    scheduled = int(TaskState.SCHEDULED)
    async with cur.copy(f"COPY snapshot_tasks ({', '.join(TASK_COLUMNS)}) FROM STDIN") as copy:
        layout, position = await store.body_layout(shard), 0
        while position < bodies.WALK_END:
            layout, position, raws = await _scan_round(store, shard, layout, position)
            found = [(rid, record.decode_fields(raw)) for rid, raw in raws]
            sent = await _sent(store, shard, [r for r, v in found if v[0] == scheduled])
            for run_id, v in found:
                if v[0] not in copied:
                    continue
                if run_id in sent:  # record.decode_fields(sent=True)
                    v[0], v[1] = TaskState.DISPATCHED, v[1] + 1
                await copy.write_row(row_of(snapshot_id, shard, run_id, v))
                count += 1
    return count


async def _copy_schedules(
    store: Store, cur: psycopg.AsyncCursor[tuple[object, ...]], snapshot_id: int, shard: int
) -> int:
    found = await read_schedule_hashes(store, shard)
    for sched in found:
        definition = json.dumps(sched.definition)
        await cur.execute(
            "INSERT INTO snapshot_schedules (snapshot_id, shard, schedule_id, tenant, definition)"
            " VALUES (%s, %s, %s, %s, %s)",
            (snapshot_id, shard, sched.schedule_id, sched.tenant, definition),
        )
        await cur.execute(
            "INSERT INTO schedules (schedule_id, shard, tenant, definition, snapshot_id)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (schedule_id) DO UPDATE SET"
            " definition = EXCLUDED.definition, snapshot_id = EXCLUDED.snapshot_id",
            (sched.schedule_id, shard, sched.tenant, definition, snapshot_id),
        )
    return len(found)
