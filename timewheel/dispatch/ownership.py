"""Which shards a scheduler node holds: its leases, taken, renewed and given up to match
its rendezvous share of the live nodes (timewheel/dispatch/leases.py), and what the
loop knows of each shard it holds."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

import structlog

from timewheel.config import Settings
from timewheel.dispatch.leases import Leases, share_of
from timewheel.dispatch.metrics import SchedulerMetrics
from timewheel.errors import TimewheelError
from timewheel.store.shard import Store

log = structlog.get_logger("timewheel.scheduler")


@dataclass(slots=True)
class ShardState:
    """What the loop knows of one owned shard, in that shard's clock (Redis TIME, ms)."""

    epoch: str = ""
    next_tick_ms: float = 0.0
    next_promote_ms: float = 0.0
    next_expire_ms: float = 0.0
    next_reap_ms: float = 0.0
    next_plan_ms: float = 0.0
    last_consumed: int = 0
    """Near entries the shard's last tick took: what its next tick is expected to take."""
    backlog: bool = False
    """Whether the shard's last tick took all it was allowed (more was due)."""

    def cap(self, now: float, settings: Settings, expire_every_ms: float) -> None:
        """No timer further out than its own interval: one set while the clock estimate
        was off (or a next due time far ahead) comes back within that interval."""
        self.next_tick_ms = min(self.next_tick_ms, now + settings.sweep_ms)
        self.next_promote_ms = min(self.next_promote_ms, now + settings.horizon_ms)
        self.next_plan_ms = min(self.next_plan_ms, now + settings.plan_interval_ms * 1.25)
        self.next_reap_ms = min(self.next_reap_ms, now + settings.reap_interval_ms)
        self.next_expire_ms = min(self.next_expire_ms, now + expire_every_ms)


class Ownership:
    """The shards one node holds. Without a node id it holds every shard, unfenced (one
    process, tests, benchmarks)."""

    def __init__(self, store: Store, node: str, lease_ttl_ms: int, metrics: SchedulerMetrics):
        self.node = node
        self.shards = store.settings.shards
        self.leases = Leases(store, node, lease_ttl_ms) if node else None
        self.metrics = metrics
        self.state: dict[int, ShardState] = (
            {} if self.leases else {s: ShardState() for s in range(self.shards)}
        )
        self.busy: set[int] = set()
        """Shards with a call of the pass in flight: a release waits for it."""
        self.planning: set[int] = set()
        """Shards the planning task is extending: a release waits for it too."""
        self.releasing: dict[int, int] = {}
        """Shards dropped whose lease is not yet released, with its epoch: a release that
        a shutdown cancelled halfway (a rebalance in the lease round, say) is finished by
        leave(), so no lease is left to expire."""
        self.acquired = asyncio.Event()
        """Set when a round took a shard, so the loop ticks it at once."""
        self.live: list[str] = []
        """The live nodes as the last round saw them (the continuous auditor reads it)."""

    def drop(self, shard: int, reason: str, **fields: object) -> None:
        """Forget a shard at once (its lease is lost, or about to be released)."""
        st = self.state.pop(shard, None)
        if st is None:
            return
        self.metrics.lease_lost.labels(reason).inc()
        self.metrics.owned.set(len(self.state))
        log.info(
            "lease_dropped", shard=shard, epoch=st.epoch, reason=reason, node=self.node, **fields
        )

    async def round(self) -> None:
        """Announce this node, then give up, renew and take leases to match its share."""
        assert self.leases is not None
        live = await self.leases.members()
        self.live = live
        wanted = share_of(self.node, live, self.shards)
        owned = dict(self.state)
        renewals = [(s, st) for s, st in owned.items() if s in wanted]
        results = await asyncio.gather(*(self.leases.renew(s, int(st.epoch)) for s, st in renewals))
        for (shard, _), held in zip(renewals, results, strict=True):
            if not held:
                self.drop(shard, "lease_lost", op="renew")
        for shard in [s for s in owned if s not in wanted]:
            await self.release(shard, "rebalance")
        missing = sorted(wanted - set(self.state))
        epochs = await asyncio.gather(*(self.leases.acquire(s) for s in missing))
        for shard, epoch in zip(missing, epochs, strict=True):
            if epoch is None:
                continue  # its previous owner still holds it; it expires or is released
            self.state[shard] = ShardState(epoch=str(epoch))
            self.metrics.lease_acquired.inc()
            log.info("lease_acquired", shard=shard, epoch=epoch, node=self.node)
        self.metrics.owned.set(len(self.state))
        if missing:
            self.acquired.set()

    async def release(self, shard: int, reason: str) -> None:
        """Give a shard up: forget it, let its call in flight finish, release the lease."""
        assert self.leases is not None
        st = self.state.get(shard)
        if st is None:
            return
        self.drop(shard, reason)
        self.releasing[shard] = int(st.epoch)
        while shard in self.busy or shard in self.planning:
            await asyncio.sleep(0.001)
        await self._release_lease(shard)

    async def _release_lease(self, shard: int) -> None:
        assert self.leases is not None
        epoch = self.releasing.get(shard)
        if epoch is None:
            return
        with contextlib.suppress(TimewheelError):
            await self.leases.release(shard, epoch)
        self.releasing.pop(shard, None)

    async def keep(self, stop: asyncio.Event) -> None:
        """A lease round every ttl/4 until `stop` is set. Nothing a tenant can make
        expensive runs on the event loop for long (fire times are computed in a thread,
        planning runs beside the tick pass), so a round is never held up behind it."""
        assert self.leases is not None
        interval_s = self.leases.ttl_ms / 4000.0
        while not stop.is_set():
            try:
                await self.round()
            except TimewheelError as exc:
                # Renewals failing for a whole ttl make every script refuse: no harm done.
                log.warning("lease_round_failed", error=str(exc), node=self.node)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval_s)

    async def leave(self) -> None:
        """Release every shard and leave the membership (graceful shutdown)."""
        assert self.leases is not None
        for shard in list(self.state):
            await self.release(shard, "shutdown")
        for shard in list(self.releasing):  # releases the lease round began, cut short
            await self._release_lease(shard)
        with contextlib.suppress(TimewheelError):
            await self.leases.members(leaving=True)
