"""The planner: the scheduler node holding a shard extends its active schedules' runs
as the plan horizon moves (lua/schedule_materialize.lua)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from timewheel.errors import RedisUnavailable
from timewheel.schedules.model import spec_from_json
from timewheel.schedules.ops import MAX_FIRES_PER_CALL, _now_ms, fires_arg, planning_args
from timewheel.schedules.spec import plan_fires
from timewheel.store.library import check
from timewheel.store.shard import Call, Store
from timewheel.types import text


@dataclass(frozen=True, slots=True)
class PlanResult:
    """One planner pass over a shard."""

    shard: int
    schedules: int
    added: int
    skipped: int
    more: bool
    """More schedules were due for planning than one pass reads."""
    earliest_next_ms: int | None = None
    """The earliest next fire time to plan among the schedules read (None: none read).
    Against the clock it says how far behind the planner is."""


def _materialized(shard: int) -> Any:
    def decode(reply: list[Any]) -> tuple[int, int]:
        check(reply, action="materialize", shard=shard)
        return int(reply[0]), int(reply[1])

    return decode


class Planner:
    """The planner's calls on the shards of one deployment."""

    def __init__(self, store: Store):
        self.store = store

    async def plan(
        self,
        shard: int,
        *,
        node: str = "",
        epoch: int | str = "",
        now_ms: int | None = None,
        clock_ms: float | None = None,
        limit: int | None = None,
    ) -> PlanResult:
        """Extend up to `limit` (default plan_batch) active schedules of the shard whose
        next fire time is within 3/4 of the plan horizon, up to the full horizon: each
        call adds about a quarter horizon of runs, so planning work comes in small,
        even steps. Raises LeaseLost when fenced out.

        clock_ms: the caller's estimate of the shard clock, for the horizon; misfire
        decisions use Redis TIME in the script (or now_ms, an override for tests)."""
        s, k, client = self.store.settings, self.store.keys, self.store.client
        local = clock_ms if clock_ms is not None else _now_ms()
        now = now_ms if now_ms is not None else int(local)
        horizon, batch = s.plan_horizon_ms, limit or s.plan_batch
        try:
            due: list[Any] = await client.zrange(
                k.plan(shard),
                "-inf",
                now + horizon - horizon // 4,
                byscore=True,
                offset=0,
                num=batch,
                withscores=True,
            )
            sids = [text(row[0]) for row in due]
            if not sids:
                return PlanResult(shard, 0, 0, 0, False)
            async with client.pipeline(transaction=False) as pipe:
                for sid in sids:
                    pipe.hmget(k.schedule(shard, sid), "spec", "cursor", "version", "state")
                rows = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"planner read failed: {exc}") from exc
        active = [
            (sid, text(spec_raw), cursor_raw, version)
            for sid, (spec_raw, cursor_raw, version, state) in zip(sids, rows, strict=True)
            if spec_raw is not None and text(state) == "active"
        ]

        def compute() -> list[tuple[list[int], int]]:
            return [
                plan_fires(spec_from_json(spec), int(cursor), now + horizon, MAX_FIRES_PER_CALL)
                for _, spec, cursor, _ in active
            ]

        # Fire times are CPU work a tenant's crons decide: off the event loop, so lease
        # renewals and ticks go on while they are computed.
        planned = await asyncio.to_thread(compute) if active else []
        calls: list[Call[tuple[int, int]]] = []
        for (sid, _, cursor_raw, version), (fires, after) in zip(active, planned, strict=True):
            call = Call(
                self.store.scripts.schedule_materialize,
                [k.meta(shard), k.schedule(shard, sid), k.events(shard)],
                [
                    sid,
                    node,
                    epoch,
                    text(version),
                    text(cursor_raw),
                    fires_arg(fires),
                    after,
                    *planning_args(self.store, shard, now_ms),
                ],
                _materialized(shard),
            )
            calls.append(call)
        added = skipped = 0
        for one_added, one_skipped in await self.store.run_many(calls) if calls else []:
            added += one_added
            skipped += one_skipped
        return PlanResult(shard, len(sids), added, skipped, len(sids) >= batch, int(due[0][1]))
