"""The scheduler loop: tick its shards when they have due runs, promote ahead of time, sleep.

A node with a `node` id claims shards by lease (timewheel/dispatch/ownership.py): a
membership and lease round every ttl/4 runs beside the tick loop; every script call carries (node,
epoch), and LEASE_LOST drops the shard at once. Without a node id the loop ticks every
shard unfenced (single process, tests, benchmarks).

Sleep: until the earliest next due time of its shards (in the shards' own clock, read
from each tick's reply), capped at `poll_cap_ms`, or until a create publishes on the
wake channel that a shard's next due time moved earlier.

Clock: every timer (tick, promote, plan, reap, expire) is kept in Redis's time, as the
store's RedisClock estimates it from a monotonic base and every reply carrying Redis
TIME (ticks, the lease round's heartbeat, a TIME read before the first pass). A timer
further out than its own interval (an estimate gone stale) is taken as due at that
interval, so neither a skewed nor a stepping node clock can pause one.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass

import structlog

from timewheel.audit.continuous import ContinuousAuditor
from timewheel.dispatch.metrics import SchedulerMetrics
from timewheel.dispatch.ownership import Ownership, ShardState
from timewheel.dispatch.rates import SYNC_EVERY_S, DispatchRates
from timewheel.dispatch.tick import Dispatch, PromoteResult, TickResult
from timewheel.dispatch.wakeups import listen_for_wakeups
from timewheel.errors import LeaseLost, TimewheelError
from timewheel.schedules.planner import Planner
from timewheel.store.shard import Store

log = structlog.get_logger("timewheel.scheduler")

EXPIRE_EVERY_MS = 10_000
PLAN_CATCH_UP_S = 0.1
"""How long a pass that finds the planner behind may keep planning, a batch at a time."""
CLOCK_JUMP_LOG_MS = 1_000
MIN_TICK_RUNS = 100
"""A shard whose last tick took this many runs has a backlog (_pass_limit); no tick of a
pass takes fewer (unless tick_batch is lower)."""


@dataclass(slots=True)
class Counters:
    ticks: int = 0
    dispatched: int = 0
    promoted: int = 0
    expired: int = 0
    reaped: int = 0
    planned: int = 0
    errors: int = 0


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
        self._plan_next = 0  # the shard the next planning pass starts at
        self._planning: asyncio.Task[None] | None = None
        self.metrics.shards.set(self.settings.shards)
        self.auditor: ContinuousAuditor | None = None
        """The continuous auditor duty (a node id and audit_interval_ms > 0 only); it
        runs while this node holds the auditor lease."""
        if self.node and self.settings.audit_interval_ms > 0:
            self.auditor = ContinuousAuditor(
                store, self.node, lease_ttl_ms, self.metrics.auditor, lambda: self.ownership.live
            )
        self._tick_limit = self.settings.tick_batch
        """The most runs each tick of the current pass takes (_pass_limit)."""

    # -- one pass ---------------------------------------------------------------------

    def _shard_now(self) -> float:
        return self.clock.now_ms()

    def _cap_timers(self, now: float) -> None:
        """No timer further out than its interval (ShardState.cap)."""
        for st in self.state.values():
            st.cap(now, self.settings, EXPIRE_EVERY_MS)

    async def run_once(self) -> int:
        """Promote, tick and expire every owned shard that is due now; returns runs
        dispatched. Planning that is due starts beside the pass (`_plan_beside`)."""
        now = self._shard_now()
        self._cap_timers(now)
        owned = list(self.state.items())
        promote = [s for s, st in owned if st.next_promote_ms <= now]
        tick = [s for s, st in owned if st.next_tick_ms <= now]
        expire = [s for s, st in owned if st.next_expire_ms <= now]
        reap = [s for s, st in owned if st.next_reap_ms <= now]
        plan = [s for s, st in owned if st.next_plan_ms <= now]
        if plan and self._planning is None:
            self._planning = asyncio.create_task(self._plan_beside(plan, now))
        self._busy.update(promote, tick, expire, reap)
        try:
            if promote:
                for res in await asyncio.gather(*(self._promote(s) for s in promote)):
                    if isinstance(res, PromoteResult):
                        self._after_promote(res)
            dispatched = 0
            if tick:
                for ticked in await self._tick_all(tick):
                    dispatched += ticked.dispatched
                    self._after_tick(ticked)
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
            await self._plan_some(shards, now)
        finally:
            self.ownership.planning.clear()
            self._planning = None
            self.woken.set()  # runs a catch-up made may be due at once

    async def _tick_all(self, shards: list[int]) -> list[TickResult]:
        """Tick the shards in as few pipelines as `tick_pipeline_runs` allows, one after
        another: one round trip while little is due, bounded ones through a backlog."""
        self._tick_limit = self._pass_limit(shards)
        out: list[TickResult] = []
        for group in self._tick_groups(shards):
            out.extend(await self._tick_pipeline(group))
        return out

    def _pass_limit(self, shards: list[int]) -> int:
        """The most runs each shard's tick takes in this pass: tick_batch, or less when
        several shards have a backlog (one tenant spread wide with a herd due) beside
        shards without one, so that a pass asks for about tick_pipeline_runs in all.
        Every shard is ticked once a pass, so the pass's length is how long a run of a
        shard without a backlog may wait behind the others; with every shard backlogged
        no shard gains from short passes, and full ticks cost Redis less per run."""
        s = self.settings
        backlogged = sum(
            1
            for shard in shards
            if (st := self.state.get(shard)) is not None and st.last_consumed >= MIN_TICK_RUNS
        )
        if backlogged >= len(self.state):
            return s.tick_batch
        share = s.tick_pipeline_runs // max(1, backlogged)
        return max(min(MIN_TICK_RUNS, s.tick_batch), min(s.tick_batch, share))

    def _tick_groups(self, shards: list[int]) -> list[list[int]]:
        """Split shards into pipelines by the runs each is expected to dispatch (what its
        last tick took): each pipeline expects at most tick_pipeline_runs, or holds one shard."""
        budget = self.settings.tick_pipeline_runs
        groups: list[list[int]] = []
        expected = 0
        for shard in shards:
            st = self.state.get(shard)
            if st is None:
                continue
            if not groups or expected + st.last_consumed > budget:
                groups.append([])
                expected = 0
            groups[-1].append(shard)
            expected += st.last_consumed
        return groups

    async def _tick_pipeline(self, shards: list[int]) -> list[TickResult]:
        """Tick the shards in one pipeline: one round trip, whatever their number."""
        wanted = [(s, self.state[s].epoch) for s in shards if s in self.state]
        sent = self.clock.sent()
        try:
            replies = await self.dispatch.tick_many(wanted, node=self.node, limit=self._tick_limit)
        except TimewheelError as exc:
            for shard, _ in wanted:
                self._failed("tick", shard, exc)
            return []
        received = self.clock.sent()
        elapsed_s = (received - sent) / 1000.0
        out = []
        for (shard, _), res in zip(wanted, replies, strict=True):
            if isinstance(res, LeaseLost):
                self._failed("tick", shard, res)
                continue
            out.append(res)
            self.counters.ticks += 1
            self.counters.dispatched += res.dispatched
            self.metrics.observe_tick(res, elapsed_s / len(wanted))
            if res.clock_back_ms >= CLOCK_JUMP_LOG_MS:
                log.warning("clock_behind_high_water_mark", shard=shard, back_ms=res.clock_back_ms)
        if out:
            # The replies' now_ms were read between send and receive: the clock takes the
            # midpoint (the pipeline's shards share one clock on standalone; close enough
            # on Cluster).
            self.clock.observe(out[-1].now_ms, sent, received)
            self.metrics.clock_offset.set(self.clock.skew_ms / 1000.0)
        return out

    def _after_tick(self, res: TickResult) -> None:
        st = self.state.get(res.shard)
        if st is None:
            return
        st.last_consumed = res.consumed
        if res.consumed >= self._tick_limit:
            st.next_tick_ms = 0.0  # a backlog is due now: come straight back
        else:
            sweep = float(res.now_ms + self.settings.sweep_ms)
            due = float(res.next_due_ms) if res.next_due_ms is not None else sweep
            st.next_tick_ms = min(due, sweep)
        self._plan_promote(st, res.promoted_until_ms, res.next_bucket_ms)

    def _plan_promote(self, st: ShardState, promoted_until: int, next_bucket: int | None) -> None:
        horizon = self.settings.horizon_ms
        # Promote again once the horizon reaches promoted_until, or a bucket comes within
        # it (a bucket can appear before promoted_until only if promotion fell behind).
        when = promoted_until - horizon
        if next_bucket is not None:
            when = min(when, next_bucket - horizon)
        st.next_promote_ms = float(when)

    async def _promote(self, shard: int) -> PromoteResult | None:
        st = self.state.get(shard)
        if st is None:
            return None
        try:
            res = await self.dispatch.promote(shard, node=self.node, epoch=st.epoch)
        except TimewheelError as exc:
            self._failed("promote", shard, exc)
            return None
        self.counters.promoted += res.moved
        return res

    def _after_promote(self, res: PromoteResult) -> None:
        st = self.state.get(res.shard)
        if st is None:
            return
        if res.more:
            st.next_promote_ms = 0.0
        else:
            self._plan_promote(st, res.promoted_until_ms, res.next_bucket_ms)
        if res.moved:
            st.next_tick_ms = 0.0  # promoted runs may be due already (after downtime)

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

    async def _plan_some(self, shards: list[int], now: float) -> None:
        """Extend schedules of `shards`, plan_batch at a time, before this pass's tick
        (runs a catch-up materializes may be due at once). One batch per pass while the
        planner keeps up; once it is behind, batch after batch for up to
        PLAN_CATCH_UP_S. Shards not reached go first next pass: planning never holds
        Redis for long, and no shard waits behind the others."""
        settings = self.settings
        budget = settings.plan_batch
        behind = False
        deadline = time.monotonic() + PLAN_CATCH_UP_S
        # Start where the last pass stopped: a fixed order would plan the first shards
        # every pass and starve the last ones whenever planning is behind.
        start = next((i for i, s in enumerate(shards) if s >= self._plan_next), 0)
        for shard in shards[start:] + shards[:start]:
            st = self.state.get(shard)
            if st is None:
                continue
            if budget <= 0:
                if not behind or time.monotonic() >= deadline:
                    self._plan_next = shard
                    break
                budget = settings.plan_batch
            # +-25 % jitter: shards started together drift apart and plan at different times.
            st.next_plan_ms = now + settings.plan_interval_ms * random.uniform(0.75, 1.25)
            try:
                res = await self.planner.plan(
                    shard, node=self.node, epoch=st.epoch, clock_ms=now, limit=budget
                )
            except TimewheelError as exc:
                self._failed("plan", shard, exc)
                continue
            budget -= res.schedules
            # A schedule read with under half a horizon of runs left waited a quarter
            # horizon past its planning point: passes come too rarely for one batch each
            # (a slow or busy host). Then a longer burst beats skipping fire times later.
            if res.earliest_next_ms is not None:
                behind = behind or res.earliest_next_ms < now + settings.plan_horizon_ms // 2
            self.counters.planned += res.added
            if res.more:
                st.next_plan_ms = 0.0
            if res.added or res.skipped:
                st.next_tick_ms = 0.0

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
        earliest = min(
            (
                min(
                    st.next_tick_ms,
                    st.next_promote_ms,
                    st.next_expire_ms,
                    st.next_reap_ms,
                    st.next_plan_ms,
                )
                for st in self.state.values()
            ),
            default=float("inf"),
        )
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
            if self._planning is not None:  # a planning pass is bounded: let it finish
                with contextlib.suppress(TimewheelError):
                    await self._planning
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
