"""The wheel's moves in one scheduler pass: promote far buckets into the near level and
tick due runs into the ready streams, for the shards a node holds.

A tick pass asks for at most `tick_pipeline_runs` runs per pipeline: shards are grouped
by what each one's last tick took, and when some shards have a backlog beside shards
without one, each tick of the pass takes less (`pass_limit`), so no shard waits long
behind a herd in another. What each reply says sets the shard's next tick and promote
(in the shard's clock, Redis TIME).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import structlog

from timewheel.config import Settings
from timewheel.dispatch.metrics import SchedulerMetrics
from timewheel.dispatch.ownership import ShardState
from timewheel.dispatch.tick import Dispatch, PromoteResult, TickResult
from timewheel.errors import LeaseLost, TimewheelError
from timewheel.store.clock import RedisClock

log = structlog.get_logger("timewheel.scheduler")

CLOCK_JUMP_LOG_MS = 1_000
MIN_TICK_RUNS = 100
"""No tick of a pass with a known backlog takes fewer (unless tick_batch is lower)."""

Failed = Callable[[str, int, TimewheelError], None]
"""What the scheduler does with a failed call: (op, shard, error)."""


@dataclass(slots=True)
class Counters:
    ticks: int = 0
    dispatched: int = 0
    promoted: int = 0
    expired: int = 0
    reaped: int = 0
    planned: int = 0
    errors: int = 0


class Ticking:
    """Promotes and ticks the shards in `state` (the node's ShardState per owned shard)."""

    def __init__(
        self,
        dispatch: Dispatch,
        state: dict[int, ShardState],
        *,
        settings: Settings,
        clock: RedisClock,
        metrics: SchedulerMetrics,
        counters: Counters,
        node: str,
        failed: Failed,
    ) -> None:
        self.dispatch = dispatch
        self.state = state
        self.settings = settings
        self.clock = clock
        self.metrics = metrics
        self.counters = counters
        self.node = node
        self.failed = failed
        self.limit = settings.tick_batch
        """The most runs each tick of the current pass takes (pass_limit)."""

    # -- promote ------------------------------------------------------------------------

    async def promote(self, shard: int) -> PromoteResult | None:
        st = self.state.get(shard)
        if st is None:
            return None
        try:
            res = await self.dispatch.promote(shard, node=self.node, epoch=st.epoch)
        except TimewheelError as exc:
            self.failed("promote", shard, exc)
            return None
        self.counters.promoted += res.moved
        return res

    def after_promote(self, res: PromoteResult) -> None:
        st = self.state.get(res.shard)
        if st is None:
            return
        if res.more:
            st.next_promote_ms = 0.0
        else:
            self._plan_promote(st, res.promoted_until_ms, res.next_bucket_ms)
        if res.moved:
            st.next_tick_ms = 0.0  # promoted runs may be due already (after downtime)

    def _plan_promote(self, st: ShardState, promoted_until: int, next_bucket: int | None) -> None:
        horizon = self.settings.horizon_ms
        # Promote again once the horizon reaches promoted_until, or a bucket comes within
        # it (a bucket can appear before promoted_until only if promotion fell behind).
        when = promoted_until - horizon
        if next_bucket is not None:
            when = min(when, next_bucket - horizon)
        st.next_promote_ms = float(when)

    # -- tick ---------------------------------------------------------------------------

    async def tick_all(self, shards: list[int]) -> list[TickResult]:
        """Tick the shards in as few pipelines as `tick_pipeline_runs` allows, one after
        another: one round trip while little is due, bounded ones through a backlog."""
        self.limit = self.pass_limit(shards)
        out: list[TickResult] = []
        for group in self.tick_groups(shards):
            out.extend(await self._tick_pipeline(group))
        return out

    def pass_limit(self, shards: list[int]) -> int:
        """The most runs each shard's tick takes in this pass: tick_batch, or less when
        several shards have a backlog (one tenant spread wide with a herd due) beside
        shards without one, so that a pass asks for about tick_pipeline_runs in all.
        Every shard is ticked once a pass, so the pass's length is how long a run of a
        shard without a backlog may wait behind the others; with every shard backlogged
        no shard gains from short passes, and full ticks cost Redis less per run.
        A shard has a backlog when its last tick took all it was allowed. While none has
        (the first pass of a herd just due: nothing tells where it sits), the pass's
        runs are shared between all the shards it ticks, so that first pass is no longer
        than the ones after it; the ticks that come back full tell where the herd is."""
        s = self.settings
        backlogged = sum(
            1 for shard in shards if (st := self.state.get(shard)) is not None and st.backlog
        )
        if backlogged >= len(self.state):
            return s.tick_batch
        if backlogged == 0:
            return max(1, min(s.tick_batch, s.tick_pipeline_runs // max(1, len(shards))))
        share = s.tick_pipeline_runs // backlogged
        return max(min(MIN_TICK_RUNS, s.tick_batch), min(s.tick_batch, share))

    def tick_groups(self, shards: list[int]) -> list[list[int]]:
        """Split shards into pipelines by the runs each is expected to dispatch (the
        pass's limit for a shard with a backlog, else what its last tick took): each
        pipeline expects at most tick_pipeline_runs, or holds one shard."""
        budget = self.settings.tick_pipeline_runs
        groups: list[list[int]] = []
        expected = 0
        for shard in shards:
            st = self.state.get(shard)
            if st is None:
                continue
            runs = self.limit if st.backlog else min(st.last_consumed, self.limit)
            if not groups or expected + runs > budget:
                groups.append([])
                expected = 0
            groups[-1].append(shard)
            expected += runs
        return groups

    async def _tick_pipeline(self, shards: list[int]) -> list[TickResult]:
        """Tick the shards in one pipeline: one round trip, whatever their number."""
        wanted = [(s, self.state[s].epoch) for s in shards if s in self.state]
        sent = self.clock.sent()
        try:
            replies = await self.dispatch.tick_many(wanted, node=self.node, limit=self.limit)
        except TimewheelError as exc:
            for shard, _ in wanted:
                self.failed("tick", shard, exc)
            return []
        received = self.clock.sent()
        elapsed_s = (received - sent) / 1000.0
        out = []
        for (shard, _), res in zip(wanted, replies, strict=True):
            if isinstance(res, LeaseLost):
                self.failed("tick", shard, res)
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

    def after_tick(self, res: TickResult) -> None:
        st = self.state.get(res.shard)
        if st is None:
            return
        st.last_consumed = res.consumed
        st.backlog = res.consumed >= self.limit
        if st.backlog:
            st.next_tick_ms = 0.0  # a backlog is due now: come straight back
        else:
            sweep = float(res.now_ms + self.settings.sweep_ms)
            due = float(res.next_due_ms) if res.next_due_ms is not None else sweep
            st.next_tick_ms = min(due, sweep)
        self._plan_promote(st, res.promoted_until_ms, res.next_bucket_ms)
