"""Listing a tenant's tasks: a bounded HSCAN walk over its shards' body hashes.

Records live in `{tw:N}:t:<xy>` (1,024 body hashes per shard, timewheel/store/keys.py), so a
listing visits every body hash of the tenant's shards (its `spread`, 1 by default) and
decodes every record there to keep the tenant's. Cost: a full listing reads every record
of those shards, other tenants' included (O(records in the tenant's shards)); one page
is bounded to one shard's body hashes (in pipelines of `PIPELINE`, so 4 round trips) and
to about `MAX_RECORDS_PER_PAGE` records decoded, and stops once `limit` items are found.
So in a big deployment a page may hold fewer than `limit` items (even none) with a
non-null `next_cursor`: keep following the cursor until it is null.
The order is by (shard, body hash, id), not by time. As with SCAN, a task created or
finished while you page may or may not appear.

The cursor is `<shard>.<hash index>.<hscan cursor>.<last id>`: opaque to clients.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from timewheel.errors import RedisUnavailable, ValidationError
from timewheel.ids import ALPHABET
from timewheel.store import record
from timewheel.store.shard import Store
from timewheel.tasks.model import Task
from timewheel.tasks.ops import TaskOps
from timewheel.types import SCAN_CURSOR_MAX, TaskState

HASHES_PER_SHARD = len(ALPHABET) ** 2
MAX_HASHES_PER_PAGE = HASHES_PER_SHARD
MAX_RECORDS_PER_PAGE = 20_000
PIPELINE = 256
HSCAN_COUNT = 1000


@dataclass(frozen=True, slots=True)
class Position:
    shard_index: int
    """Index into the tenant's sorted shard list."""
    bucket: int
    hscan: int
    after: str


def _suffix(bucket: int) -> str:
    return ALPHABET[bucket // len(ALPHABET)] + ALPHABET[bucket % len(ALPHABET)]


def _parse_cursor(cursor: str | None) -> Position:
    if not cursor:
        return Position(0, 0, 0, "")
    shard_index, bucket, hscan, after = cursor.split(".", 3)
    if int(bucket) >= HASHES_PER_SHARD or int(hscan) > SCAN_CURSOR_MAX:
        raise ValidationError("cursor is not one this API gave out", field="cursor")
    return Position(int(shard_index), int(bucket), int(hscan), after)


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
        span = range(pos.bucket, min(HASHES_PER_SHARD, pos.bucket + PIPELINE))
        try:
            pipe: Any = store.client.pipeline(transaction=False)
            for i, bucket in enumerate(span):
                key = store.keys.tag(shard) + "t:" + _suffix(bucket)
                pipe.hscan(key, cursor=pos.hscan if i == 0 else 0, count=HSCAN_COUNT)
            replies: list[Any] = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"cannot list tasks: {exc}") from exc
        waiting = _tenant_waiting(store, shard, span, replies, tenant)
        sent = await TaskOps(store).sent_runs(shard, waiting)
        for i, (bucket, (next_hscan, entries)) in enumerate(zip(span, replies, strict=True)):
            visited += 1
            examined += len(entries)
            after = pos.after if i == 0 else ""
            key = store.keys.tag(shard) + "t:" + _suffix(bucket)
            found = {
                store.keys.run_id_in_body(shard, key, f.decode()): raw for f, raw in entries.items()
            }
            for run_id in sorted(found):
                if after and run_id <= after:
                    continue
                task = record.decode(run_id, found[run_id], sent=run_id in sent)
                if not _keep(task, tenant, queue, state):
                    continue
                out.append(task)
                if len(out) == limit:
                    return out, f"{pos.shard_index}.{bucket}.{pos.hscan if i == 0 else 0}.{run_id}"
            if int(next_hscan) != 0:  # a big (hashtable) body hash: go on within it
                pos = Position(pos.shard_index, bucket, int(next_hscan), "")
                break
        else:
            last = span[-1] if len(span) else pos.bucket
            if last + 1 >= HASHES_PER_SHARD:
                pos = Position(pos.shard_index + 1, 0, 0, "")
            else:
                pos = Position(pos.shard_index, last + 1, 0, "")
    if pos.shard_index >= len(shards):
        return out, None
    return out, f"{pos.shard_index}.{pos.bucket}.{pos.hscan}.{pos.after}"


def _tenant_waiting(
    store: Store, shard: int, span: range, replies: list[Any], tenant: str
) -> list[Task]:
    """The tenant's records in `replies` that say scheduled (a record's first byte is its
    state): which of them were sent is read from the near level (Engine.sent_runs)."""
    out = []
    for bucket, (_, entries) in zip(span, replies, strict=True):
        key = store.keys.tag(shard) + "t:" + _suffix(bucket)
        for f, raw in entries.items():
            if raw[:1] == bytes([TaskState.SCHEDULED]):
                task = record.decode(store.keys.run_id_in_body(shard, key, f.decode()), raw)
                if task.tenant == tenant:
                    out.append(task)
    return out
