"""Tenants' dispatch rates, copied into the shards whose tick enforces them.

A tenant's limits live in the global tenants hash (timewheel/tenants.py), but
lua/dispatch_tick.lua may read only keys of its own shard (one Cluster slot). So every shard a
tenant uses holds its share of the rate in `keys.rates(shard)`: dispatch_rate divided by
the number of the tenant's shards, every shard it has used (store/placement.py: a
change of the tenant's `shards` leaves its older runs where they are, so those shards
dispatch too). The tick spends it through a token bucket per (shard, tenant); see the
header of lua/dispatch_tick.lua.

The shares are exact upper bounds: the tenant never gets more than dispatch_rate runs/s
in all. They add up to the full rate only while every one of its shards has runs due; a
tenant whose due runs sit in one shard gets that shard's share (so a tenant whose spread
was made smaller keeps the smaller shares of the larger union).

Copies are written when a tenant is created or its limits change, and every scheduler
node reconciles all of them every SYNC_EVERY_S. That repairs a copy lost to a crash
between the two writes, or to a restore, or left stale by a change of the deployment's
spread, within that time; so too the old share a sync writes back when it read the
tenants just before a change.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import structlog
from redis.exceptions import RedisError

from timewheel.errors import RedisUnavailable
from timewheel.store.connection import RedisClient
from timewheel.store.keys import Keys
from timewheel.store.placement import Placements, from_record
from timewheel.store.shard import Store

log = structlog.get_logger("timewheel.rates")

SYNC_EVERY_S = 30.0


def share_text(rate: float, shards: int) -> str:
    """One shard's share of a rate, as stored (runs/s)."""
    return f"{rate / shards:.6g}"


class DispatchRates:
    """The per-shard copies of tenants' dispatch rates."""

    def __init__(self, client: RedisClient, keys: Keys, placements: Placements) -> None:
        self.client = client
        self.keys = keys
        self.placements = placements
        self.shards = placements.settings.shards

    @classmethod
    def of(cls, store: Store) -> DispatchRates:
        """The rates of the deployment `store` serves."""
        return cls(store.client, store.keys, store.placements)

    async def put(self, tenant: str, rate: float | None, used: Sequence[int] = ()) -> None:
        """Set (or, with None, clear) a tenant's rate in each of its shards: `used`, every
        shard it has used (read from its record when not given)."""
        shards = list(used) or list((await self.placements.load(tenant, fresh=True)).used)
        pipe = self.client.pipeline(transaction=False)
        for shard in shards:
            if rate:
                pipe.hset(self.keys.rates(shard), tenant, share_text(rate, len(shards)))
            else:
                pipe.hdel(self.keys.rates(shard), tenant)
        try:
            await pipe.execute()
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"dispatch rates: {exc}") from exc

    async def wanted(self) -> dict[int, dict[str, str]]:
        """What every shard's rates hash should hold, read from the tenants hash."""
        out: dict[int, dict[str, str]] = {shard: {} for shard in range(self.shards)}
        async for tenant, raw in self.client.hscan_iter(self.keys.tenants(), count=1000):
            name = tenant.decode() if isinstance(tenant, bytes) else tenant
            try:
                data = json.loads(raw)
                rate = data["limits"].get("dispatch_rate")
            except (ValueError, KeyError, TypeError, AttributeError):
                log.warning("tenant_record_unreadable", tenant=name)
                continue
            if isinstance(rate, int | float) and rate > 0:
                shards = from_record(name, data, self.placements.settings).used
                for shard in shards:
                    out[shard][name] = share_text(rate, len(shards))
        return out

    async def sync(self) -> int:
        """Make every shard's copies match the tenants hash; returns the fields changed."""
        try:
            wanted = await self.wanted()
            pipe = self.client.pipeline(transaction=False)
            for shard in range(self.shards):
                pipe.hgetall(self.keys.rates(shard))
            held = await pipe.execute()
            pipe = self.client.pipeline(transaction=False)
            changed = 0
            for shard, have_raw in enumerate(held):
                have = {k.decode(): v.decode() for k, v in have_raw.items()}
                want = wanted[shard]
                stale = [t for t in have if t not in want]
                fresh = {t: v for t, v in want.items() if have.get(t) != v}
                if stale:
                    pipe.hdel(self.keys.rates(shard), *stale)
                if fresh:
                    pipe.hset(self.keys.rates(shard), items=[x for kv in fresh.items() for x in kv])
                changed += len(stale) + len(fresh)
            if changed:
                await pipe.execute()
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"dispatch rates: {exc}") from exc
        return changed
