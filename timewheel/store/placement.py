"""Which shards hold a tenant's tasks: its placement, and every shard it has used.

A tenant's new tasks and schedules go to the shards of its placement; by default
`Settings.default_spread` consecutive shards from a hash of its name
(`ids.tenant_shards`). The tenant limit `shards` (timewheel/tenants.py) sets the number
for one tenant: the list chosen is stored in the tenant's record with the union of every
list it has had, since a task stays in the shard written in its id when the placement
changes. Everything that reads a tenant's shards (listings, dead letters, usage counts,
the workers' stream reads, the dispatch rate shares) reads that union.

The list: on standalone Redis, consecutive shards from the hash (a larger spread from
the same base holds a smaller one); on a Cluster, shards taken round robin over the
primaries their hash tags map to, in the order of the consecutive shards from the hash,
so `n` shards sit on min(n, primaries) primaries and the first one is the hash's own.
With the same topology the list for n is the first n of the list for any larger n.

The record (fields of the tenant's JSON, all optional; a record without them has the
default placement): `"shards": [..]`, the placement, `"shards_used": [..]`, the union,
and `"shards_before": [[..], ..]`, the lists it had before (the latest MAX_BEFORE), so
an idempotency key's retry finds the task its first try made under an earlier list.
`Placements` caches what it read for CACHE_TTL_S per process.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from timewheel import ids
from timewheel.config import Settings
from timewheel.errors import RedisUnavailable
from timewheel.store.connection import RedisClient
from timewheel.store.keys import Keys

CACHE_TTL_S = 1.0
"""How old a placement a create or a read may use (as the tenant cache's)."""
MAX_BEFORE = 16
"""Earlier placements a tenant's record keeps for idempotent retries."""
MAX_CACHED = 10_000
"""Most tenants whose placement one process keeps (the cache starts again past it)."""


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a tenant's new tasks go (`shards`) and every shard that may hold its tasks
    (`used`, in the order of first use, so a listing's cursor, an index into it, stays
    valid as it grows; always holds `shards`)."""

    shards: tuple[int, ...]
    used: tuple[int, ...]
    before: tuple[tuple[int, ...], ...] = ()
    """The tenant's earlier placements, latest first."""

    def shard_for(self, token: str) -> int:
        """The shard of a new task or schedule: one of `shards`, chosen by its token."""
        return self.shards[zlib.crc32(token.encode()) % len(self.shards)]

    def spread_tokens(self, count: int, draw: Callable[[], str]) -> list[str]:
        """`count` new random tokens (from `draw`) whose shards take turns over `shards`
        from a random one, so a batch's tasks split as evenly as they can: each shard's
        cap of the tenant (timewheel/limits.py) is a share of its max_pending, and random
        ids would fill one share before the others. Each shard is still the one
        `shard_for` gives the token."""
        if len(self.shards) == 1:
            return [draw() for _ in range(count)]
        width = len(self.shards)
        need = [count // width + (1 if i < count % width else 0) for i in range(width)]
        turn = zlib.crc32(draw().encode()) % width
        need = need[-turn:] + need[:-turn]
        out: list[str] = []
        while len(out) < count:
            token = draw()
            index = zlib.crc32(token.encode()) % width
            if need[index]:
                need[index] -= 1
                out.append(token)
        return out

    def earlier_shards(self, token: str) -> list[int]:
        """The shards an earlier placement gave this token, other than today's."""
        pick = zlib.crc32(token.encode())
        now = self.shard_for(token)
        return list(dict.fromkeys(p[pick % len(p)] for p in self.before if p[pick % len(p)] != now))


def default(tenant: str, settings: Settings) -> Placement:
    """The placement of a tenant without its own: default_spread shards from the hash."""
    shards = tuple(ids.tenant_shards(tenant, settings.default_spread, settings.shards))
    return Placement(shards, shards)


def _shard_list(value: Any, shards: int) -> tuple[int, ...]:
    """A stored shard list, without repeats and without what is not a shard here."""
    if not isinstance(value, list):
        return ()
    out = [s for s in value if isinstance(s, int) and not isinstance(s, bool) and 0 <= s < shards]
    return tuple(dict.fromkeys(out))


def from_record(tenant: str, data: Mapping[str, Any] | None, settings: Settings) -> Placement:
    """The placement a tenant's stored record gives (the default without one)."""
    base = default(tenant, settings)
    if not data:
        return base
    shards = _shard_list(data.get("shards"), settings.shards) or base.shards
    used = _shard_list(data.get("shards_used"), settings.shards)
    raw_before = data.get("shards_before")
    lists = raw_before if isinstance(raw_before, list) else []
    before = tuple(b for b in (_shard_list(v, settings.shards) for v in lists) if b)
    return Placement(shards, tuple(dict.fromkeys([*used, *base.shards, *shards])), before)


def choose(
    tenant: str, count: int, shards: int, primary_of: Callable[[int], str] | None = None
) -> tuple[int, ...]:
    """`count` shards for a tenant: consecutive from its hash, or with `primary_of` (the
    node holding a shard's slot) round robin over the primaries in that order."""
    count = max(1, min(count, shards))
    order = ids.tenant_shards(tenant, shards, shards)
    if primary_of is None:
        return tuple(order[:count])
    by_node: dict[str, list[int]] = {}
    for shard in order:
        by_node.setdefault(primary_of(shard), []).append(shard)
    picked = [s for row in itertools.zip_longest(*by_node.values()) for s in row if s is not None]
    return tuple(picked[:count])


def primaries(client: RedisClient | None, keys: Keys) -> Callable[[int], str] | None:
    """The primary holding each shard's slot on a Cluster (from the client's view of the
    topology), or None on standalone Redis."""
    if not isinstance(client, RedisCluster):
        return None

    def primary_of(shard: int) -> str:
        node = client.get_node_from_key(keys.meta(shard))
        return str(node.name) if node is not None else ""

    return primary_of


def changed(
    tenant: str,
    data: Mapping[str, Any],
    count: int | None,
    settings: Settings,
    client: RedisClient | None,
) -> dict[str, Any]:
    """The record fields after setting the tenant's spread to `count` (None: back to the
    deployment's default): the new list, and the union with every list before."""
    before = from_record(tenant, data, settings)
    keys = Keys(settings.prefix)
    if count is None:
        shards = default(tenant, settings).shards
    else:
        shards = choose(tenant, count, settings.shards, primaries(client, keys))
    used = list(dict.fromkeys([*before.used, *shards]))
    earlier = before.before
    if tuple(shards) != before.shards:
        earlier = (before.shards, *earlier)
    kept = [list(p) for p in dict.fromkeys(earlier) if p != tuple(shards)][:MAX_BEFORE]
    return {"shards": list(shards), "shards_used": used, "shards_before": kept}


class Placements:
    """Tenants' placements as this process last read them (each for CACHE_TTL_S)."""

    def __init__(self, client: RedisClient, keys: Keys, settings: Settings):
        self.client = client
        self.keys = keys
        self.settings = settings
        self._cache: dict[str, tuple[float, Placement]] = {}
        self._reads: dict[str, asyncio.Future[None]] = {}

    def get(self, tenant: str) -> Placement:
        """The placement last read (however old), else the default."""
        hit = self._cache.get(tenant)
        return hit[1] if hit is not None else default(tenant, self.settings)

    def learn(self, tenant: str, data: Mapping[str, Any] | None) -> Placement:
        """Keep the placement of a tenant record just read (by this or another reader)."""
        found = from_record(tenant, data, self.settings)
        if len(self._cache) >= MAX_CACHED:
            self._cache.clear()
        self._cache[tenant] = (time.monotonic() + CACHE_TTL_S, found)
        return found

    async def load(self, tenant: str, *, fresh: bool = False) -> Placement:
        """The tenant's placement, read again when the one kept is older than
        CACHE_TTL_S (or with `fresh`)."""
        hit = self._cache.get(tenant)
        if not fresh and hit is not None and hit[0] > time.monotonic():
            return hit[1]
        [found] = await self.load_many([tenant], fresh=fresh)
        return found

    async def load_many(self, tenants: Iterable[str], *, fresh: bool = False) -> list[Placement]:
        """The placements of several tenants; the stale ones read in one round trip
        (concurrent callers share a read in flight, unless `fresh`)."""
        names = list(dict.fromkeys(tenants))
        now = time.monotonic()
        stale = [t for t in names if fresh or (h := self._cache.get(t)) is None or h[0] <= now]
        if stale:
            todo = [t for t in stale if fresh or t not in self._reads]
            waits = {self._reads[t] for t in stale if t not in todo and t in self._reads}
            if todo:
                read = asyncio.ensure_future(self._read(todo))
                for tenant in todo:
                    self._reads[tenant] = read
                waits.add(read)
            await asyncio.gather(*(asyncio.shield(w) for w in waits))
        return [self.get(t) for t in names]

    async def _read(self, tenants: list[str]) -> None:
        me = asyncio.current_task()
        try:
            raws = await self.client.hmget(self.keys.tenants(), tenants)
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"tenant shards: {exc}") from exc
        finally:
            for tenant in tenants:
                if self._reads.get(tenant) is me:
                    del self._reads[tenant]
        for tenant, raw in zip(tenants, raws, strict=True):
            data = None
            if raw is not None:
                try:
                    data = json.loads(raw)
                except ValueError:
                    data = None
            self.learn(tenant, data if isinstance(data, dict) else None)
