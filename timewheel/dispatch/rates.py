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

A tenant's own max_backlog (the cap on each of its ready streams' undelivered entries,
lua/lib/park.lua) is copied the same way into `keys.caps(shard)`, whole: the cap is per
stream, and every shard has its own stream per (tenant, queue). A tenant not there has the
deployment's Settings.tenant_max_backlog, which the tick is given.

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

    async def put_cap(self, tenant: str, cap: int | None, used: Sequence[int] = ()) -> None:
        """Set (or, with None, clear: the deployment's default) a tenant's max_backlog in
        each of its shards."""
        shards = list(used) or list((await self.placements.load(tenant, fresh=True)).used)
        pipe = self.client.pipeline(transaction=False)
        for shard in shards:
            if cap is None:
                pipe.hdel(self.keys.caps(shard), tenant)
            else:
                pipe.hset(self.keys.caps(shard), tenant, str(cap))
        try:
            await pipe.execute()
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"backlog caps: {exc}") from exc

    async def parked(self, tenant: str, used: Sequence[int] = ()) -> dict[str, int]:
        """queue -> the tenant's runs parked over its shards (lua/lib/park.lua): due, but
        waiting in the wheel while the queue's ready stream is over its backlog cap."""
        shards = list(used) or list((await self.placements.load(tenant, fresh=True)).used)
        try:
            pipe = self.client.pipeline(transaction=False)
            for shard in shards:
                pipe.hkeys(self.keys.parked(shard))
            listed = await pipe.execute()
            pipe = self.client.pipeline(transaction=False)
            queues: list[str] = []
            for shard, names in zip(shards, listed, strict=True):
                for raw in names:
                    owner, _, queue = (raw.decode() if isinstance(raw, bytes) else raw).partition(
                        ":"
                    )
                    if owner == tenant:
                        pipe.zcard(self.keys.park(shard, tenant, queue))
                        queues.append(queue)
            counts = await pipe.execute() if queues else []
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"parked runs: {exc}") from exc
        out: dict[str, int] = {}
        for queue, n in zip(queues, counts, strict=True):
            if int(n) > 0:
                out[queue] = out.get(queue, 0) + int(n)
        return out

    async def wanted(self) -> tuple[dict[int, dict[str, str]], dict[int, dict[str, str]]]:
        """What every shard's rates and caps hashes should hold, read from the tenants hash."""
        out: dict[int, dict[str, str]] = {shard: {} for shard in range(self.shards)}
        caps: dict[int, dict[str, str]] = {shard: {} for shard in range(self.shards)}
        async for tenant, raw in self.client.hscan_iter(self.keys.tenants(), count=1000):
            name = tenant.decode() if isinstance(tenant, bytes) else tenant
            try:
                data = json.loads(raw)
                rate = data["limits"].get("dispatch_rate")
                cap = data["limits"].get("max_backlog")
            except (ValueError, KeyError, TypeError, AttributeError):
                log.warning("tenant_record_unreadable", tenant=name)
                continue
            rated = isinstance(rate, int | float) and rate > 0
            capped = isinstance(cap, int) and cap >= 0
            if rated or capped:
                shards = from_record(name, data, self.placements.settings).used
                for shard in shards:
                    if rated:
                        out[shard][name] = share_text(rate, len(shards))
                    if capped:
                        caps[shard][name] = str(cap)
        return out, caps

    async def sync(self) -> int:
        """Make every shard's copies match the tenants hash; returns the fields changed."""
        try:
            rates, caps = await self.wanted()
            targets = [(self.keys.rates, rates), (self.keys.caps, caps)]
            pipe = self.client.pipeline(transaction=False)
            for key_of, _ in targets:
                for shard in range(self.shards):
                    pipe.hgetall(key_of(shard))
            held = await pipe.execute()
            pipe = self.client.pipeline(transaction=False)
            changed = 0
            for n, (key_of, wanted) in enumerate(targets):
                for shard in range(self.shards):
                    have_raw = held[n * self.shards + shard]
                    have = {k.decode(): v.decode() for k, v in have_raw.items()}
                    want = wanted[shard]
                    stale = [t for t in have if t not in want]
                    fresh = {t: v for t, v in want.items() if have.get(t) != v}
                    if stale:
                        pipe.hdel(key_of(shard), *stale)
                    if fresh:
                        pipe.hset(key_of(shard), items=[x for kv in fresh.items() for x in kv])
                    changed += len(stale) + len(fresh)
            if changed:
                await pipe.execute()
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"dispatch rates: {exc}") from exc
        return changed
