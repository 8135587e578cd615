"""The planner: the scheduler node holding a shard extends its active schedules' runs
as the plan horizon moves (lua/schedule_materialize.lua).

Which schedules a pass extends is lua/schedule_due.lua's choice: the plan index is kept
per tenant, and a pass gives each tenant with schedules due an equal share of its batch,
so one tenant's thousands of schedules (or a tenant far behind) take one share and every
other tenant's schedules are still extended in the same pass."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from timewheel.schedules.model import spec_from_json
from timewheel.schedules.ops import MAX_FIRES_PER_CALL, fires_arg, planning_args
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


MAX_DUE = 1000
"""Most schedules (and tenants) one schedule_due call returns: its loops stay short."""


@dataclass(frozen=True, slots=True)
class DueSchedule:
    """A schedule a planner pass extends, as lua/schedule_due.lua read it."""

    tenant: str
    sid: str
    next_ms: int
    spec: str
    cursor: int
    version: str


@dataclass(frozen=True, slots=True)
class Due:
    rows: list[DueSchedule]
    more: bool
    """Some tenant had more schedules due than its share of the pass."""


def _due(reply: list[Any]) -> Due:
    n, rows = int(reply[1]), []
    for i in range(n):
        tenant, sid, next_ms, spec, cursor, version = reply[2 + 6 * i : 8 + 6 * i]
        rows.append(
            DueSchedule(
                text(tenant), text(sid), int(next_ms), text(spec), int(cursor), text(version)
            )
        )
    return Due(rows, bool(int(reply[0])))


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
        s, k = self.store.settings, self.store.keys
        local = clock_ms if clock_ms is not None else self.store.clock.now_ms()
        now = now_ms if now_ms is not None else int(local)
        horizon, batch = s.plan_horizon_ms, limit or s.plan_batch
        due = await self.store.run(
            Call(
                self.store.scripts.schedule_due,
                [k.plan_tenants(shard)],
                [now + horizon - horizon // 4, min(batch, MAX_DUE), min(batch, MAX_DUE)],
                _due,
            ),
        )
        if not due.rows:
            return PlanResult(shard, 0, 0, 0, due.more)
        active = due.rows

        def compute() -> list[tuple[list[int], int]]:
            return [
                plan_fires(spec_from_json(row.spec), row.cursor, now + horizon, MAX_FIRES_PER_CALL)
                for row in active
            ]

        # Fire times are CPU work a tenant's crons decide: off the event loop, so lease
        # renewals and ticks go on while they are computed.
        planned = await asyncio.to_thread(compute) if active else []
        calls: list[Call[tuple[int, int]]] = []
        for row, (fires, after) in zip(active, planned, strict=True):
            call = Call(
                self.store.scripts.schedule_materialize,
                [k.meta(shard), k.schedule(shard, row.sid), k.events(shard)],
                [
                    row.sid,
                    node,
                    epoch,
                    row.version,
                    row.cursor,
                    fires_arg(fires),
                    after,
                    *planning_args(self.store, shard, now_ms),
                    row.tenant,
                ],
                _materialized(shard),
            )
            calls.append(call)
        added = skipped = 0
        for one_added, one_skipped in await self.store.run_many(calls) if calls else []:
            added += one_added
            skipped += one_skipped
        earliest = min(row.next_ms for row in active)
        return PlanResult(shard, len(active), added, skipped, due.more, earliest)
