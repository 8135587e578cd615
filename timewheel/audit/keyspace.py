"""Which near levels, far buckets and ready streams a pass reads: found by one SCAN of
every primary's keyspace at the start of the pass.

The indexes (due, wheel, groups) name most of them, but not a level, bucket or stream
that fell out of its index, which is what an audit must find; so the pass SCANs for the
key names (`{<prefix>:*}:[nwqdu]*`, COUNT 1000 a step; the dead-letter streams
among them are kept aside, for the continuous auditor's count) and keeps those of the shards it
audits. One pass over the keyspace, not one per shard: on a standalone server every key
of every shard is in one keyspace. Memory: the names of the near levels (tenants), far
buckets and streams of the shards not audited yet, never one per run.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from timewheel.errors import RedisUnavailable
from timewheel.store.shard import Store
from timewheel.types import text

SCAN_COUNT = 1000
"""Keys SCAN looks at per step."""


@dataclass(slots=True)
class ShardKeys:
    """A shard's near levels, far buckets and ready streams, sorted once complete."""

    near: list[str] = field(default_factory=list)
    buckets: list[str] = field(default_factory=list)
    streams: list[str] = field(default_factory=list)
    usage: list[str] = field(default_factory=list)
    """Tenants with a usage hash (use:<tenant>) in the shard."""

    def sort(self) -> None:
        for names in (self.near, self.buckets, self.streams, self.usage):
            names[:] = sorted(set(names))


def _glob_escape(value: str) -> str:
    """A literal for a SCAN MATCH pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in value)


class KeyDiscovery:
    """SCAN of every primary, a step at a time, sorting the names found by shard."""

    def __init__(self, store: Store, shards: Iterable[int]):
        self.store = store
        self.keys: dict[int, ShardKeys] = {shard: ShardKeys() for shard in shards}
        self.pattern = "{" + _glob_escape(store.keys.prefix) + ":*}:[nwqdu]*"
        self.dead: list[str] = []
        """Every dead-letter stream found (the continuous auditor counts their entries)."""
        client = store.client
        self._nodes: list[Any] = (
            list(client.get_primaries()) if isinstance(client, RedisCluster) else [None]
        )
        self._cursor = 0
        self.scanned = 0
        """Key names SCAN returned."""

    @property
    def done(self) -> bool:
        return not self._nodes

    async def step(self) -> int:
        """One SCAN call; the names it returned."""
        if self.done:
            return 0
        node, client = self._nodes[0], self.store.client
        try:
            if node is None:
                cursor, names = await client.scan(
                    cursor=self._cursor, match=self.pattern, count=SCAN_COUNT
                )
            else:
                reply: Any = await client.scan(
                    cursor=self._cursor, match=self.pattern, count=SCAN_COUNT, target_nodes=node
                )
                cursors, names = reply  # {node name: cursor}, names
                cursor = next(iter(cursors.values()), 0)
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"SCAN for the audit failed: {exc}") from exc
        for raw in names:
            self._sort_in(text(raw))
        self.scanned += len(names)
        self._cursor = int(cursor)
        if self._cursor == 0:
            self._nodes.pop(0)
            if self.done:
                for found in self.keys.values():
                    found.sort()
        return len(names)

    def _sort_in(self, name: str) -> None:
        k = self.store.keys
        try:
            shard = k.shard_of_key(name)
        except ValueError:
            return
        found = self.keys.get(shard)
        if found is None:
            return
        rest = name[len(k.tag(shard)) :]
        if rest.startswith("dead:"):
            self.dead.append(name)
            return
        if rest.startswith("use:"):
            found.usage.append(rest[4:])
            return
        if rest.startswith("near:"):
            found.near.append(name)
        elif rest.startswith(("w:", "wd:")):  # far buckets and distant ones
            found.buckets.append(name)
        elif rest.startswith("q:"):
            found.streams.append(name)

    def take(self, shard: int) -> ShardKeys:
        """A shard's names, handed over once (the pass holds them no longer)."""
        return self.keys.pop(shard, ShardKeys())
