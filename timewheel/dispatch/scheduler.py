"""The scheduler loop: tick its shards when they have due runs, promote ahead of time, sleep.

A node with a `node` id claims shards by lease (timewheel/dispatch/ownership.py): a
membership and lease round every ttl/4 runs beside the tick loop; every script call carries (node,
epoch), and LEASE_LOST drops the shard at once. Without a node id the loop ticks every
shard unfenced (single process, tests, benchmarks).

A pass: promote and tick the shards that are due (timewheel/dispatch/ticking.py), expire
finished records and reap expired leases here; planning schedules runs as a task beside
the pass (timewheel/dispatch/planning.py), so ticks never wait for fire-time maths.

Sleep: until the earliest next due time of its shards (in the shards' own clock, read
from each tick's reply), capped at `poll_cap_ms`, or until a create publishes on the
wake channel that a shard's next due time moved earlier. Plan timers count only while no
planning pass is out (the pass wakes the loop when it ends).

Clock: every timer (tick, promote, plan, reap, expire) is kept in Redis's time, as the
store's RedisClock estimates it from a monotonic base and every reply carrying Redis
TIME (ticks, the lease round's heartbeat, a TIME read before the first pass). A timer
further out than its own interval (an estimate gone stale) is taken as due at that
interval, so neither a skewed nor a stepping node clock can pause one.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import structlog

from timewheel.audit.continuous import ContinuousAuditor
from timewheel.dispatch.metrics import SchedulerMetrics
from timewheel.dispatch.ownership import Ownership, ShardState
from timewheel.dispatch.planning import Planning
from timewheel.dispatch.rates import SYNC_EVERY_S, DispatchRates
from timewheel.dispatch.tick import Dispatch, PromoteResult
from timewheel.dispatch.ticking import Counters, Ticking
from timewheel.dispatch.wakeups import listen_for_wakeups
from timewheel.errors import LeaseLost, TimewheelError
from timewheel.schedules.planner import Planner
from timewheel.store.shard import Store

log = structlog.get_logger("timewheel.scheduler")

EXPIRE_EVERY_MS = 10_000
CAP_EVERY_S = 0.1
"""How often the timers are held to their intervals (Scheduler._cap_timers)."""


class Scheduler:
    """Ticks, promotes and expires the shards this node holds."""

    def __init__(
        self,
        store: Store,
        *,
        node: str | None = None,
        lease_ttl_ms: int = 2000,
        metrics: SchedulerMetrics | None = None,
    ) -> None:
        self.store = store
        self.settings = store.settings
        self.dispatch = Dispatch(store)
        self.planner = Planner(store)
        self.node = node or ""
        self.metrics = metrics or SchedulerMetrics()
        self.ownership = Ownership(store, self.node, lease_ttl_ms, self.metrics)
        self.state: dict[int, ShardState] = self.ownership.state
        """The shards this node holds (the ownership's own dict)."""
        self.counters = Counters()
        self.clock = store.clock
        self.woken = self.ownership.acquired
        self._busy = self.ownership.busy
        self._plan_task: asyncio.Task[None] | None = None
        self._capped_at = float("-inf")
        """When the timers were last capped (time.monotonic())."""
        self.metrics.shards.set(self.settings.shards)
        self.auditor: ContinuousAuditor | None = None
        """The continuous auditor duty (a node id and audit_interval_ms > 0 only); it
        runs while this node holds the auditor lease."""
        if self.node and self.settings.audit_interval_ms > 0:
            self.auditor = ContinuousAuditor(
                store, self.node, lease_ttl_ms, self.metrics.auditor, lambda: self.ownership.live
            )
        self.ticking = Ticking(
            self.dispatch,
            self.state,
            settings=self.settings,
            clock=self.clock,
            metrics=self.metrics,
            counters=self.counters,
            node=self.node,
            failed=self._failed,
        )
        self.planning = Planning(
            self.planner,
            self.state,
            settings=self.settings,
            counters=self.counters,
            node=self.node,
            failed=self._failed,
        )

    # -- one pass ---------------------------------------------------------------------

    def _shard_now(self) -> float:
        return self.clock.now_ms()

    def _cap_timers(self, now: float) -> None:
        """No timer further out than its interval (ShardState.cap), looked at every
        CAP_EVERY_S of this process's monotonic clock rather than every pass (a busy
        node makes hundreds of passes a second over all its shards): a timer set far out
        comes back within its interval plus that."""
        mono = time.monotonic()
        if mono - self._capped_at < CAP_EVERY_S:
            return
        self._capped_at = mono
        for st in self.state.values():
            st.cap(now, self.settings, EXPIRE_EVERY_MS)

    def _due(self, now: float) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
        """The shards whose promote, tick, expire, reap and plan timers are due, in one
        pass over the shards."""
        promote: list[int] = []
        tick: list[int] = []
        expire: list[int] = []
        reap: list[int] = []
        plan: list[int] = []
        for s, st in self.state.items():
            if st.next_promote_ms <= now:
                promote.append(s)
            if st.next_tick_ms <= now:
                tick.append(s)
            if st.next_expire_ms <= now:
                expire.append(s)
            if st.next_reap_ms <= now:
                reap.append(s)
            if st.next_plan_ms <= now:
                plan.append(s)
        return promote, tick, expire, reap, plan

    async def run_once(self) -> int:
        """Promote, tick and expire every owned shard that is due now; returns runs
        dispatched. Planning that is due starts beside the pass (`_plan_beside`)."""
        now = self._shard_now()
        self._cap_timers(now)
        promote, tick, expire, reap, plan = self._due(now)
        if plan and self._plan_task is None:
            self._plan_task = asyncio.create_task(self._plan_beside(plan, now))
        self._busy.update(promote, tick, expire, reap)
        try:
            if promote:
                for res in await asyncio.gather(*(self.ticking.promote(s) for s in promote)):
                    if isinstance(res, PromoteResult):
                        self.ticking.after_promote(res)
            dispatched = 0
            if tick:
                for ticked in await self.ticking.tick_all(tick):
                    dispatched += ticked.dispatched
                    self.ticking.after_tick(ticked)
            if expire:
                await asyncio.gather(*(self._expire(s, now) for s in expire))
            if reap:
                await asyncio.gather(*(self._reap(s, now) for s in reap))
        finally:
            self._busy.clear()
        return dispatched

    async def _plan_beside(self, shards: list[int], now: float) -> None:
        """One planning pass as a task of its own: fire times cost what a tenant's crons
        make them cost, so ticks (and lease renewals) never wait for them. A shard being
        planned is busy: a release waits for it."""
        self.ownership.planning.update(shards)
        try:
            await self.planning.plan_some(shards, now)
        finally:
            self.ownership.planning.clear()
            self._plan_task = None
            self.woken.set()  # runs a catch-up made may be due at once

    async def _expire(self, shard: int, now: float) -> None:
        st = self.state.get(shard)
        if st is None:
            return
        st.next_expire_ms = now + EXPIRE_EVERY_MS
        try:
            expired = await self.dispatch.expire(shard)
        except TimewheelError as exc:
            self._failed("expire", shard, exc)
            return
        self.counters.expired += expired.deleted
        if expired.more:
            st.next_expire_ms = 0.0

    async def _reap(self, shard: int, now: float) -> None:
        st = self.state.get(shard)
        if st is None:
            return
        st.next_reap_ms = now + self.settings.reap_interval_ms
        try:
            reaped = await self.dispatch.reap(shard, node=self.node, epoch=st.epoch)
        except TimewheelError as exc:
            self._failed("reap", shard, exc)
            return
        retried, buried = reaped.retried, reaped.buried
        if retried or buried:
            self.counters.reaped += retried + buried
            log.info("leases_expired", shard=shard, retried=retried, dead=buried)
            st.next_tick_ms = 0.0  # a retry may be due at once

    def _failed(self, op: str, shard: int, exc: TimewheelError) -> None:
        if isinstance(exc, LeaseLost):
            self.ownership.drop(shard, "lease_lost", op=op)
            return
        self.counters.errors += 1
        log.warning("scheduler_call_failed", op=op, shard=shard, error=str(exc))
        st = self.state.get(shard)
        if st is None:
            return
        retry_at = self._shard_now() + 200
        if op == "tick":
            st.next_tick_ms = retry_at
        elif op == "promote":
            st.next_promote_ms = retry_at

    async def _rates_loop(self, stop: asyncio.Event) -> None:
        """Reconcile the shards' copies of tenants' dispatch rates (dispatch/rates.py)."""
        rates = DispatchRates.of(self.store)
        while not stop.is_set():
            try:
                changed = await rates.sync()
                if changed:
                    log.info("dispatch_rates_synced", changed=changed, node=self.node or None)
            except TimewheelError as exc:
                log.warning("dispatch_rates_sync_failed", error=str(exc), node=self.node)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=SYNC_EVERY_S)

    # -- the loop ---------------------------------------------------------------------

    def _sleep_s(self) -> float:
        """Until the earliest timer of the shards. While a planning pass is out, plan
        timers are its own (it wakes the loop when it ends): the loop would otherwise
        spin, passing over every shard, until the pass had visited them all."""
        earliest = float("inf")
        planning = self._plan_task is not None
        for st in self.state.values():
            t = min(st.next_tick_ms, st.next_promote_ms, st.next_expire_ms, st.next_reap_ms)
            if t < earliest:
                earliest = t
            if not planning and st.next_plan_ms < earliest:
                earliest = st.next_plan_ms
        wait_ms = min(earliest - self._shard_now(), float(self.settings.poll_cap_ms))
        return max(wait_ms, 0.0) / 1000.0

    def wake(self, shard: int) -> None:
        """Tick `shard` at once, if this node holds it (called for wake-up messages)."""
        st = self.state.get(shard)
        if st is not None:
            st.next_tick_ms = 0.0
            st.next_promote_ms = min(st.next_promote_ms, self._shard_now())
            self.woken.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Run until `stop` is set; the pass in progress finishes, then leases are released."""
        helpers = [
            asyncio.create_task(
                listen_for_wakeups(
                    self.settings.redis_url, self.store.keys.wake_channel(), self.wake, stop
                )
            ),
            asyncio.create_task(self._rates_loop(stop)),
        ]
        # Redis's time before the first pass: no timer is ever set in this node's clock.
        while not self.clock.known and not stop.is_set():
            try:
                await self.clock.sync(self.store.client)
            except TimewheelError as exc:
                log.warning("clock_sync_failed", error=str(exc), node=self.node or None)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=0.5)
        self.metrics.clock_offset.set(self.clock.skew_ms / 1000.0)
        if self.ownership.leases is not None:
            await self.ownership.round()
            helpers.append(asyncio.create_task(self.ownership.keep(stop)))
        duty = None if self.auditor is None else asyncio.create_task(self.auditor.run(stop))
        log.info("scheduler_started", node=self.node or None, shards=len(self.state))
        try:
            while not stop.is_set():
                await self.run_once()
                delay = self._sleep_s()
                if delay <= 0:
                    await asyncio.sleep(0)
                    continue
                self.woken.clear()
                sleeper = asyncio.create_task(self.woken.wait())
                stopper = asyncio.create_task(stop.wait())
                await asyncio.wait({sleeper, stopper}, timeout=delay, return_when="FIRST_COMPLETED")
                sleeper.cancel()
                stopper.cancel()
        finally:
            if self._plan_task is not None:  # a planning pass is bounded: let it finish
                with contextlib.suppress(TimewheelError):
                    await self._plan_task
            if duty is not None:  # stop is set: its step ends, it releases the lease
                stop.set()
                with contextlib.suppress(TimewheelError):
                    await duty
            for helper in helpers:
                helper.cancel()
            for helper in helpers:
                with contextlib.suppress(asyncio.CancelledError):
                    await helper
            if self.ownership.leases is not None:
                await self.ownership.leave()
            log.info(
                "scheduler_stopped", node=self.node or None, dispatched=self.counters.dispatched
            )
