"""The storage guard: creates stop before Redis fills up, so the work in it can drain.

A deployment's Redis runs with `maxmemory-policy noeviction` (nothing is ever evicted),
so a full Redis refuses every write, acks and cancels included, and for every tenant.
Before a create, its callers (task, batch, schedule create and update, trigger,
backfill, replay) ask the guard about the shards they write to; a shard's node past
`storage_guard_ratio` of its ceiling refuses with StorageFull (HTTP 507) before anything
is written. The ceiling is the node's `maxmemory`, or `storage_max_bytes` when that is
set and lower; with neither there is no guard. Used memory is measured as Redis does
for maxmemory: `used_memory` less `mem_not_counted_for_evict` (replication and AOF
buffers). Dispatch, ack, fail, cancel, delete and purge never ask: they finish or remove
work, and the margin above the guard is theirs.

On a Cluster each primary is judged on its own: a shard's creates stop when the node
holding its slot is full, and the others go on. INFO memory is read at most once per
CHECK_INTERVAL_S per node and process (concurrent creates share one read); a node that
cannot be read lets creates through (the write meets the same failure and answers it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import structlog
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from timewheel.config import Settings
from timewheel.errors import StorageFull
from timewheel.store.connection import RedisClient
from timewheel.store.keys import Keys

CHECK_INTERVAL_S = 1.0
"""How long one reading of a node's INFO memory is used."""

log = structlog.get_logger("timewheel.store")


@dataclass(frozen=True, slots=True)
class Reading:
    """One node's memory, as the guard last read it."""

    node: str
    used_bytes: int
    ceiling_bytes: int
    """0: no ceiling (no maxmemory and no storage_max_bytes)."""
    ratio: float

    @property
    def full(self) -> bool:
        return self.ceiling_bytes > 0 and self.used_bytes >= self.ratio * self.ceiling_bytes


def reading_of(node: str, info: dict[str, Any], settings: Settings) -> Reading:
    """A node's Reading from its INFO memory."""
    used = int(info.get("used_memory", 0)) - int(info.get("mem_not_counted_for_evict", 0))
    ceilings = [c for c in (int(info.get("maxmemory", 0)), settings.storage_max_bytes) if c > 0]
    return Reading(node, used, min(ceilings) if ceilings else 0, settings.storage_guard_ratio)


class StorageGuard:
    """The storage guard of one process (one per Store)."""

    def __init__(self, client: RedisClient, settings: Settings, keys: Keys):
        self.client = client
        self.settings = settings
        self.keys = keys
        self._cluster = isinstance(client, RedisCluster)
        self._readings: dict[str, tuple[float, Reading | None]] = {}
        self._reads: dict[str, asyncio.Future[Reading | None]] = {}

    def _node_of(self, shard: int) -> Any:
        """The Cluster primary holding a shard's slot, or None on a single Redis."""
        if isinstance(self.client, RedisCluster):
            return self.client.get_node_from_key(self.keys.meta(shard))
        return None

    async def check(self, shards: Iterable[int]) -> None:
        """Raise StorageFull if the node holding any of `shards` is past the guard."""
        if not self._cluster:
            hit = self._readings.get("")  # the common case: a reading less than 1 s old
            if hit is not None and hit[0] > time.monotonic():
                self._raise_if_full(hit[1])
            else:
                self._raise_if_full(await self._reading("", None))
            return
        nodes: dict[str, Any] = {}
        for shard in set(shards):
            node = self._node_of(shard)
            nodes.setdefault(node.name, node)
        for name, node in nodes.items():
            self._raise_if_full(await self._reading(name, node))

    async def used_ratio(self) -> float | None:
        """The fullest primary's memory in use over its ceiling, from readings at most
        CHECK_INTERVAL_S old (None: no node has a ceiling, or none could be read)."""
        nodes = self.client.get_primaries() if isinstance(self.client, RedisCluster) else [None]
        ratios = []
        for node in nodes:
            reading = await self._reading(node.name if node is not None else "", node)
            if reading is not None and reading.ceiling_bytes > 0:
                ratios.append(reading.used_bytes / reading.ceiling_bytes)
        return max(ratios) if ratios else None

    @staticmethod
    def _raise_if_full(reading: Reading | None) -> None:
        if reading is not None and reading.full:
            where = reading.node or "Redis"
            raise StorageFull(
                f"{where} uses {reading.used_bytes} of its {reading.ceiling_bytes} bytes "
                f"(creates stop at {reading.ratio:.0%}); creates are refused until work "
                "finishes or memory is freed (cancel, ack, purge dead letters, delete "
                "schedules) or the ceiling is raised",
                node=reading.node,
                used_bytes=reading.used_bytes,
                ceiling_bytes=reading.ceiling_bytes,
            )

    async def _reading(self, name: str, node: Any) -> Reading | None:
        hit = self._readings.get(name)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        pending = self._reads.get(name)
        if pending is None:
            pending = asyncio.ensure_future(self._read(name, node))
            self._reads[name] = pending
        return await asyncio.shield(pending)

    async def _read(self, name: str, node: Any) -> Reading | None:
        try:
            target = {} if node is None else {"target_nodes": node}
            info: dict[str, Any] = await self.client.info("memory", **target)
            reading: Reading | None = reading_of(name, info, self.settings)
        except (RedisError, OSError) as exc:
            log.warning("storage_guard_unread", node=name or None, error=str(exc))
            reading = None
        finally:
            self._reads.pop(name, None)
        before = self._readings.get(name)
        was_full = before is not None and before[1] is not None and before[1].full
        if reading is not None and reading.full != was_full:
            log.warning(
                "storage_guard_full" if reading.full else "storage_guard_clear",
                node=name or None,
                used_bytes=reading.used_bytes,
                ceiling_bytes=reading.ceiling_bytes,
            )
        self._readings[name] = (time.monotonic() + CHECK_INTERVAL_S, reading)
        return reading
