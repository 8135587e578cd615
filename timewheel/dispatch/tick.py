"""The scheduler's operations on a shard it holds, each one Lua call fenced by its lease.

Where a run goes when it comes due: `promote` moves far buckets that start within the
horizon into the near level (lua/dispatch_promote.lua); `tick` moves due runs of the
near level into their ready streams (lua/dispatch_tick.lua); `reap` fails runs whose
executor lease expired (lua/dispatch_reap.lua); `expire` deletes finished records past
their retention (lua/dispatch_expire.lua).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from timewheel.errors import LeaseLost
from timewheel.store.library import check
from timewheel.store.shard import Call, Store, clock_arg

LAG_BUCKETS_MS: tuple[int, ...] = (2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 60000)
"""Upper bounds (inclusive) of the dispatch lag histogram a tick counts into."""

_LAG_BOUNDS = ",".join(str(b) for b in LAG_BUCKETS_MS)

REAP_BATCH = 500
"""Most expired pending entries one dispatch_reap.lua call fails (bounds the call)."""

EXPIRE_BATCH = 2000
"""Most finished records one dispatch_expire.lua call deletes."""


@dataclass(frozen=True, slots=True)
class TickResult:
    """One tick of one shard."""

    shard: int
    dispatched: int
    """Runs written to ready streams."""
    consumed: int
    """Near-level entries taken (stale ones included); equal to the limit means more due now."""
    next_due_ms: int | None
    now_ms: int
    """The shard's clock as the tick used it (max of TIME and the high-water mark)."""
    clock_back_ms: int
    """How far TIME stood behind the high-water mark (0 normally)."""
    next_bucket_ms: int | None
    promoted_until_ms: int
    per_tenant: dict[str, int] = field(default_factory=dict)
    """Runs dispatched per tenant."""
    lag_counts: list[int] = field(default_factory=list)
    """Dispatched runs by lag (the tick's clock minus the due time): the i-th count is of
    lags <= LAG_BUCKETS_MS[i], the last of lags past every bound; empty if none was sent."""
    lag_sum_ms: int = 0
    """The dispatched runs' lags added up."""
    backlog: int = 0
    """Runs still due after the call (counted only when the call hit its limit)."""
    held: dict[str, int] = field(default_factory=dict)
    """Per tenant held back by its dispatch rate: its runs still due in this shard."""
    tenant_lag_ms: dict[str, int] = field(default_factory=dict)
    """Per tenant with runs dispatched: their lags added up (ms)."""
    parked: int = 0
    """Runs parked in the shard after the call: due, but their ready stream is over its
    backlog cap (lua/lib/park.lua)."""
    released: int = 0
    """Parked runs this call put back into the near level (their stream drained)."""
    parked_pairs: dict[tuple[str, str], int] = field(default_factory=dict)
    """(tenant, queue) -> runs parked, after the call."""


@dataclass(frozen=True, slots=True)
class PromoteResult:
    """One promote call on one shard."""

    shard: int
    moved: int
    more: bool
    promoted_until_ms: int
    next_bucket_ms: int | None
    cascaded: int = 0
    """Runs moved from distant buckets into far ones (lua/lib/wheel.lua)."""


@dataclass(frozen=True, slots=True)
class ExpireResult:
    """One expire call on one shard."""

    deleted: int
    more: bool


@dataclass(frozen=True, slots=True)
class ReapResult:
    """One reap call on one shard: expired leases that became a retry or a dead letter."""

    retried: int
    buried: int


def _opt_int(value: Any) -> int | None:
    return None if value is None or int(value) < 0 else int(value)


def _tenant_counts(flat: list[Any]) -> dict[str, int]:
    """A Lua reply list {tenant, count, ...} as a dict."""
    return {flat[i].decode(): int(flat[i + 1]) for i in range(0, len(flat), 2)}


def _ticked(shard: int) -> Any:
    def decode(reply: list[Any]) -> TickResult:
        check(reply, action="tick", shard=shard)
        (dispatched, next_due, now, clock_back, next_bucket, promoted, consumed, per_tenant,
         lag_counts, backlog, lag_sum, held, lags, parked, released, pairs) = reply  # fmt: skip
        return TickResult(
            shard=shard,
            dispatched=int(dispatched),
            next_due_ms=_opt_int(next_due),
            now_ms=int(now),
            clock_back_ms=int(clock_back),
            next_bucket_ms=_opt_int(next_bucket),
            promoted_until_ms=int(promoted),
            consumed=int(consumed),
            per_tenant=_tenant_counts(per_tenant),
            lag_counts=[int(v) for v in lag_counts],
            backlog=int(backlog),
            lag_sum_ms=int(lag_sum),
            held=_tenant_counts(held),
            tenant_lag_ms=_tenant_counts(lags),
            parked=int(parked),
            released=int(released),
            parked_pairs={
                (pairs[i].decode(), pairs[i + 1].decode()): int(pairs[i + 2])
                for i in range(0, len(pairs), 3)
            },
        )

    return decode


def _promoted(shard: int) -> Any:
    def decode(reply: list[Any]) -> PromoteResult:
        check(reply, action="promote", shard=shard)
        moved, more, promoted_until, next_bucket, cascaded = reply
        return PromoteResult(
            shard=shard,
            moved=int(moved),
            more=bool(int(more)),
            promoted_until_ms=int(promoted_until),
            next_bucket_ms=_opt_int(next_bucket),
            cascaded=int(cascaded),
        )

    return decode


def _expired(reply: list[Any]) -> ExpireResult:
    return ExpireResult(int(reply[0]), bool(int(reply[1])))


def _reaped(shard: int) -> Any:
    def decode(reply: list[Any]) -> ReapResult:
        check(reply, action="reap", shard=shard)
        return ReapResult(int(reply[0]), int(reply[1]))

    return decode


class Dispatch:
    """The scheduler-side calls on the shards of one deployment. `node` and `epoch` are
    the lease the caller holds ('' for both: unfenced, as tests and tools call)."""

    def __init__(self, store: Store):
        self.store = store

    def tick_call(
        self,
        shard: int,
        *,
        limit: int | None = None,
        now_ms: int | None = None,
        node: str = "",
        epoch: int | str = "",
    ) -> Call[TickResult]:
        k, s = self.store.keys, self.store.settings
        return Call(
            self.store.scripts.dispatch_tick,
            [k.meta(shard), k.due(shard), k.events(shard)],
            [
                limit or s.tick_batch,
                clock_arg(now_ms),
                node,
                epoch,
                s.event_log_max,
                s.misfire_ms,
                s.bucket_ms,
                _LAG_BOUNDS,
                s.tenant_max_backlog,
            ],
            _ticked(shard),
        )

    async def tick(
        self,
        shard: int,
        *,
        limit: int | None = None,
        now_ms: int | None = None,
        node: str = "",
        epoch: int | str = "",
    ) -> TickResult:
        """Dispatch up to `limit` due runs of one shard. Raises LeaseLost when fenced out."""
        call = self.tick_call(shard, limit=limit, now_ms=now_ms, node=node, epoch=epoch)
        return await self.store.run(call)

    async def tick_many(
        self, shards: Sequence[tuple[int, int | str]], *, node: str = "", limit: int | None = None
    ) -> list[TickResult | LeaseLost]:
        """Tick several shards, given as (shard, epoch), in one pipeline (one per node on
        Cluster), each up to `limit` runs (tick_batch). A shard whose lease is lost
        answers LeaseLost in its place."""
        calls = [
            self.tick_call(shard, limit=limit, node=node, epoch=epoch) for shard, epoch in shards
        ]
        out: list[TickResult | LeaseLost] = []
        for call, reply in zip(calls, await self.store.send(calls), strict=True):
            try:
                out.append(call.decode(reply))
            except LeaseLost as lost:
                out.append(lost)
        return out

    async def promote(
        self,
        shard: int,
        *,
        limit: int | None = None,
        now_ms: int | None = None,
        node: str = "",
        epoch: int | str = "",
    ) -> PromoteResult:
        """Move far buckets that start within the horizon into the near level."""
        k, s = self.store.keys, self.store.settings
        call = Call(
            self.store.scripts.dispatch_promote,
            [k.meta(shard), k.due(shard), k.wheel(shard)],
            [s.horizon_ms, s.bucket_ms, limit or s.promote_batch, clock_arg(now_ms), node, epoch],
            _promoted(shard),
        )
        return await self.store.run(call)

    async def expire(
        self, shard: int, *, limit: int = EXPIRE_BATCH, now_ms: int | None = None
    ) -> ExpireResult:
        """Delete finished records past retention."""
        k, s = self.store.keys, self.store.settings
        call = Call(
            self.store.scripts.dispatch_expire,
            [k.meta(shard), k.expiry(shard)],
            [s.retention_ms, s.bucket_ms, limit, clock_arg(now_ms)],
            _expired,
        )
        return await self.store.run(call)

    async def reap(
        self, shard: int, *, node: str = "", epoch: int | str = "", now_ms: int | None = None
    ) -> ReapResult:
        """Expired executor leases in one shard become failed attempts."""
        k, s = self.store.keys, self.store.settings
        call = Call(
            self.store.scripts.dispatch_reap,
            [k.meta(shard), k.groups(shard), k.events(shard)],
            [
                node,
                epoch,
                s.min_visibility_timeout_ms,
                s.visibility_timeout_ms,
                REAP_BATCH,
                repr(random.random()),
                s.retry_defaults_json(),
                *self.store.shared(shard, now_ms, wake=False),
            ],
            _reaped(shard),
        )
        return await self.store.run(call)
