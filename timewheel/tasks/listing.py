"""Listing a tenant's tasks: a bounded HSCAN walk over its shards' body hashes.

Records live in a shard's body hashes (as many as the shard's records need,
timewheel/store/bodies.py), so a listing visits every body hash of the tenant's shards
(every shard it has used) and decodes every record there to keep the tenant's. Cost: a
full listing reads every record of those shards, other tenants' included (O(records in
the tenant's shards)); one page is bounded to `MAX_HASHES_PER_PAGE` body hashes (in
pipelines of `PIPELINE`) and to about `MAX_RECORDS_PER_PAGE` records decoded, and stops
once `limit` items are found.
So in a big deployment a page may hold fewer than `limit` items (even none) with a
non-null `next_cursor`: keep following the cursor until it is null.
The order is by (shard, body hash, id), not by time. As with SCAN, a task created or
finished while you page may or may not appear. Body hashes walk by position
(store/bodies.py), which a hash that splits between two pages keeps: a task is not
missed for it.

The cursor is `<shard>.<walk position>.<hscan cursor>.<last id>`: opaque to clients.
Within a page the tasks of a hash come in walk order (position, then id), and the cursor
holds the last one's: the next page goes on after it whatever split meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from timewheel.errors import RedisUnavailable, ValidationError
from timewheel.store import bodies, record
from timewheel.store.bodies import BodyHash, BodyLayout
from timewheel.store.shard import Store
from timewheel.tasks.model import Task
from timewheel.tasks.ops import TaskOps
from timewheel.types import SCAN_CURSOR_MAX, TaskState

MAX_HASHES_PER_PAGE = 1024
MAX_RECORDS_PER_PAGE = 20_000
PIPELINE = 256
HSCAN_COUNT = 1000


@dataclass(frozen=True, slots=True)
class Position:
    shard_index: int
    """Index into the tenant's sorted shard list."""
    position: int
    """The walk position to go on from (store/bodies.py): a hash's, or with `after` the
    position of the task last given."""
    hscan: int
    after: str


def _parse_cursor(cursor: str | None) -> Position:
    if not cursor:
        return Position(0, 0, 0, "")
    shard_index, position, hscan, after = cursor.split(".", 3)
    if int(position) >= bodies.WALK_END or int(hscan) > SCAN_CURSOR_MAX:
        raise ValidationError("cursor is not one this API gave out", field="cursor")
    return Position(int(shard_index), int(position), int(hscan), after)


def _keep(task: Task, tenant: str, queue: str | None, state: str | None) -> bool:
    return (
        task.tenant == tenant
        and (queue is None or task.queue == queue)
        and (state is None or task.state == state)
    )


async def list_tasks(
    store: Store,
    tenant: str,
    *,
    queue: str | None = None,
    state: str | None = None,
    limit: int = 100,
    cursor: str | None = None,
) -> tuple[list[Task], str | None]:
    """A page of the tenant's tasks (filtered by queue and state) and the next cursor."""
    shards = await store.tenant_shards(tenant)  # first-use order: the cursor's index
    pos = _parse_cursor(cursor)
    out: list[Task] = []
    visited = examined = 0
    while (
        pos.shard_index < len(shards)
        and visited < MAX_HASHES_PER_PAGE
        and examined < MAX_RECORDS_PER_PAGE
    ):
        shard = shards[pos.shard_index]
        span, replies = await _read_round(store, shard, pos)
        waiting = _tenant_waiting(shard, span, replies, tenant)
        sent = await TaskOps(store).sent_runs(shard, waiting)
        for i, (h, (next_hscan, entries)) in enumerate(zip(span, replies, strict=True)):
            visited += 1
            examined += len(entries)
            found = {h.run_id(shard, f.decode()): raw for f, raw in entries.items()}
            # In walk order, so a cursor stays good when the hash splits (store/bodies.py).
            for at, run_id in sorted((bodies.position_of(r), r) for r in found):
                if pos.after and (at, run_id) <= (pos.position, pos.after):
                    continue
                task = record.decode(run_id, found[run_id], sent=run_id in sent)
                if not _keep(task, tenant, queue, state):
                    continue
                out.append(task)
                if len(out) == limit:
                    hscan = pos.hscan if i == 0 else 0
                    return out, f"{pos.shard_index}.{at}.{hscan}.{run_id}"
            if int(next_hscan) != 0:  # a big (hashtable) body hash: go on within it
                pos = Position(pos.shard_index, h.position, int(next_hscan), "")
                break
        else:
            end = span[-1].next_position if span else bodies.WALK_END
            if end >= bodies.WALK_END:
                pos = Position(pos.shard_index + 1, 0, 0, "")
            else:
                pos = Position(pos.shard_index, end, 0, "")
    if pos.shard_index >= len(shards):
        return out, None
    return out, f"{pos.shard_index}.{pos.position}.{pos.hscan}.{pos.after}"


async def _read_round(store: Store, shard: int, pos: Position) -> tuple[list[BodyHash], list[Any]]:
    """HSCAN of up to PIPELINE body hashes from `pos` on, in one round trip, and the
    hashes they were: the shard's layout is read after them, and a hash that split
    meanwhile has the round read again by the new layout (store/bodies.py)."""
    layout = store.body_layouts.get(shard) or BodyLayout()
    while True:
        span: list[BodyHash] = []
        for h in layout.walk(store.keys.tag(shard), pos.position):
            span.append(h)
            if len(span) == PIPELINE:
                break
        try:
            pipe: Any = store.client.pipeline(transaction=False)
            for i, h in enumerate(span):
                pipe.hscan(h.key, cursor=pos.hscan if i == 0 else 0, count=HSCAN_COUNT)
            pipe.hmget(store.keys.meta(shard), *bodies.META_FIELDS)
            *replies, current = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"cannot list tasks: {exc}") from exc
        actual = BodyLayout.read(current)
        if actual == layout:
            return span, replies
        layout = store.body_layouts[shard] = actual


def _tenant_waiting(
    shard: int, span: list[BodyHash], replies: list[Any], tenant: str
) -> list[Task]:
    """The tenant's records in `replies` that say scheduled (a record's first byte is its
    state): which of them were sent is read from the near level (Engine.sent_runs)."""
    out = []
    for h, (_, entries) in zip(span, replies, strict=True):
        for f, raw in entries.items():
            if raw[:1] == bytes([TaskState.SCHEDULED]):
                task = record.decode(h.run_id(shard, f.decode()), raw)
                if task.tenant == tenant:
                    out.append(task)
    return out
