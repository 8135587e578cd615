"""The planning pass of a scheduler node: extend its shards' schedules with fire times,
a batch at a time, beside the tick loop (timewheel/schedules/planner.py does one shard).

One batch per pass while the planner keeps up; once it is behind (a schedule read with
under half a horizon of runs left), batch after batch for up to PLAN_CATCH_UP_S. A pass
starts where the last one stopped, so no shard waits behind the others, and planning
never holds Redis for long.
"""

from __future__ import annotations

import random
import time

from timewheel.config import Settings
from timewheel.dispatch.ownership import ShardState
from timewheel.dispatch.ticking import Counters, Failed
from timewheel.errors import TimewheelError
from timewheel.schedules.planner import Planner

PLAN_CATCH_UP_S = 0.1
"""How long a pass that finds the planner behind may keep planning, a batch at a time."""


class Planning:
    """Plans the schedules of the shards in `state` (the node's ShardState per shard)."""

    def __init__(
        self,
        planner: Planner,
        state: dict[int, ShardState],
        *,
        settings: Settings,
        counters: Counters,
        node: str,
        failed: Failed,
    ) -> None:
        self.planner = planner
        self.state = state
        self.settings = settings
        self.counters = counters
        self.node = node
        self.failed = failed
        self.next_shard = 0
        """The shard the next pass starts at."""

    async def plan_some(self, shards: list[int], now: float) -> None:
        """Extend schedules of `shards`, plan_batch at a time (runs a catch-up
        materializes may be due at once: their shard is ticked next pass)."""
        settings = self.settings
        budget = settings.plan_batch
        behind = False
        deadline = time.monotonic() + PLAN_CATCH_UP_S
        # Start where the last pass stopped: a fixed order would plan the first shards
        # every pass and starve the last ones whenever planning is behind.
        start = next((i for i, s in enumerate(shards) if s >= self.next_shard), 0)
        for shard in shards[start:] + shards[:start]:
            st = self.state.get(shard)
            if st is None:
                continue
            if budget <= 0:
                if not behind or time.monotonic() >= deadline:
                    self.next_shard = shard
                    break
                budget = settings.plan_batch
            # +-25 % jitter: shards started together drift apart and plan at different times.
            st.next_plan_ms = now + settings.plan_interval_ms * random.uniform(0.75, 1.25)
            try:
                res = await self.planner.plan(
                    shard, node=self.node, epoch=st.epoch, clock_ms=now, limit=budget
                )
            except TimewheelError as exc:
                self.failed("plan", shard, exc)
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
