"""Schedules on a fixed shard clock: creating one at NOW, one scheduler pass at a given
time, and a schedule's events read back."""

from __future__ import annotations

from typing import Any

from timewheel.config import Settings
from timewheel.engine import Engine
from timewheel.models import Delivery
from timewheel.schedules.model import NewSchedule
from timewheel.schedules.spec import ScheduleSpec
from timewheel.testing.clock import NOW
from timewheel.testing.dispatch import all_deliveries
from timewheel.testing.settings import test_settings


def schedule_settings(redis_url: str) -> Settings:
    """A 5 s plan horizon, 2 s misfire and a 60 s promote horizon: schedules every second
    plan a few runs ahead, and catch-up after a few seconds of downtime is visible."""
    return test_settings(redis_url, plan_horizon_ms=5_000, misfire_ms=2_000, horizon_ms=60_000)


def every(seconds: float, **kw: Any) -> ScheduleSpec:
    return ScheduleSpec(every_s=seconds, **kw)


async def create(engine: Engine, spec: ScheduleSpec, **kw: Any) -> str:
    """A new schedule of tenant acme, created at NOW; returns its id."""
    sched, created = await engine.schedules.create(
        NewSchedule(tenant="acme", spec=spec, **kw), now_ms=NOW
    )
    assert created
    return sched.id


async def run_at(engine: Engine, now: int, *, plan: bool = True) -> list[Delivery]:
    """What one scheduler pass at `now` does: plan, promote, tick; returns new deliveries."""
    before = {d.entry_id + d.stream for d in await all_deliveries(engine)}
    for shard in range(engine.settings.shards):
        if plan:
            await engine.planner.plan(shard, now_ms=now)
        await engine.dispatch.promote(shard, now_ms=now)
        while (await engine.dispatch.tick(shard, now_ms=now)).consumed:
            pass
    return [d for d in await all_deliveries(engine) if d.entry_id + d.stream not in before]


async def events(engine: Engine, sid: str, kind: str) -> list[dict[str, str]]:
    """The `kind` events (skipped, held ...) of schedule `sid`'s runs, oldest first."""
    shard = int(sid[:3], 16)
    entries: Any = await engine.client.xrange(engine.keys.events(shard))
    out = []
    for _, fields in entries:
        f = {k.decode(): v.decode() for k, v in fields.items()}
        if f["e"] == kind and f.get("id", "").startswith(sid):
            out.append(f)
    return out
