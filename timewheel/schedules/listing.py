"""Listing a tenant's schedules: an SSCAN walk over its shards' schedule sets.

Every shard keeps the ids of its schedules in `{tw:N}:schedules` (lua/schedule_create.lua
adds, lua/schedule_delete.lua removes), shared by the tenants placed in that shard. A
page scans the tenant's shards in order, keeps the ids whose schedule belongs to the
tenant (one pipelined HGET per scan step) and reads those in full. It is bounded to
`MAX_SCANNED_PER_PAGE` ids looked at, so a page may hold fewer than `limit` items with a
non-null `next_cursor`: follow the cursor until it is null. As with SCAN, the order is
the set's, and a schedule created or deleted while you page may or may not appear.

The cursor is `<shard index>.<sscan cursor>.<last id given>` (the last part empty unless a
page ended inside one scan step): opaque to clients.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.exceptions import RedisError

from timewheel.errors import RedisUnavailable, TaskNotFound, ValidationError
from timewheel.schedules.model import Schedule
from timewheel.schedules.ops import ScheduleOps
from timewheel.store.shard import Store
from timewheel.types import SCAN_CURSOR_MAX, text

MAX_SCANNED_PER_PAGE = 10_000
SSCAN_COUNT = 500


def _parse_cursor(cursor: str | None) -> tuple[int, int, str]:
    if not cursor:
        return 0, 0, ""
    try:
        shard_index, scan, after = cursor.split(".", 2)
        if int(scan) > SCAN_CURSOR_MAX:
            raise ValueError(scan)
        return int(shard_index), int(scan), after
    except ValueError:
        raise ValidationError("cursor is not one this API gave out", field="cursor") from None


async def list_schedules(
    store: Store, tenant: str, *, limit: int = 100, cursor: str | None = None
) -> tuple[list[Schedule], str | None]:
    """A page of the tenant's schedules and the next cursor (None: no more)."""
    shards = await store.tenant_shards(tenant)  # first-use order: the cursor's index
    shard_index, scan, after = _parse_cursor(cursor)
    ids: list[str] = []
    scanned = 0
    next_cursor: str | None = None
    while shard_index < len(shards):
        if len(ids) >= limit or scanned >= MAX_SCANNED_PER_PAGE:
            next_cursor = f"{shard_index}.{scan}."
            break
        shard = shards[shard_index]
        try:
            next_scan, members = await store.client.sscan(
                store.keys.schedules(shard), cursor=scan, count=SSCAN_COUNT
            )
            found = sorted(sid for sid in map(text, members) if sid > after)
            pipe: Any = store.client.pipeline(transaction=False)
            for sid in found:
                pipe.hget(store.keys.schedule(shard, sid), "tenant")
            owners = await pipe.execute() if found else []
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"cannot list schedules: {exc}") from exc
        scanned += len(found)
        mine = [sid for sid, o in zip(found, owners, strict=True) if o and text(o) == tenant]
        room = limit - len(ids)
        if len(mine) > room:
            # Small sets answer a whole step at once, whatever COUNT says: stop inside the
            # step and come back to it, past the last id given.
            ids.extend(mine[:room])
            next_cursor = f"{shard_index}.{scan}.{ids[-1]}"
            break
        ids.extend(mine)
        after = ""
        if int(next_scan) == 0:
            shard_index, scan = shard_index + 1, 0
        else:
            scan = int(next_scan)
    got = await asyncio.gather(
        *(ScheduleOps(store).get(tenant, sid) for sid in ids), return_exceptions=True
    )
    items = []
    for item in got:
        if isinstance(item, TaskNotFound):
            continue  # deleted since the scan
        if isinstance(item, BaseException):
            raise item
        items.append(item)
    return items, next_cursor
