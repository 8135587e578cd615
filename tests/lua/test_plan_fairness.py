"""The planner shares a pass between tenants (lua/schedule_due.lua): many schedules of
one tenant, due first, do not push another tenant's schedule out of the pass; the index
of earlier library versions is taken over; a stale index entry does not block."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import pytest

from timewheel.engine import Engine
from timewheel.schedules.model import NewSchedule
from timewheel.schedules.spec import ScheduleSpec
from timewheel.testing.clock import NOW
from timewheel.testing.schedules import schedule_settings

SHARD = 0


@pytest.fixture
async def engine(redis_url: str) -> AsyncIterator[Engine]:
    """One shard, so every tenant's schedules share one plan pass."""
    eng = await Engine.connect(dataclasses.replace(schedule_settings(redis_url), shards=1))
    try:
        yield eng
    finally:
        await eng.close()


async def _many(engine: Engine, tenant: str, n: int, at: int) -> list[str]:
    out = []
    for _ in range(n):
        sched, _ = await engine.schedules.create(
            NewSchedule(tenant=tenant, spec=ScheduleSpec(every_s=1)), now_ms=at
        )
        out.append(sched.id)
    return out


async def _planned(engine: Engine, tenant: str, sid: str) -> int:
    return (await engine.schedules.get(tenant, sid)).runs_planned


async def test_a_tenant_with_many_earlier_schedules_takes_one_share_of_a_pass(
    engine: Engine,
) -> None:
    noisy = await _many(engine, "noisy", 120, NOW)
    # Created later: in one index ordered by next fire time it would come after all 120.
    (quiet,) = await _many(engine, "quiet", 1, NOW + 500)
    before = await _planned(engine, "quiet", quiet)
    res = await engine.planner.plan(SHARD, now_ms=NOW + 3_000, limit=20)
    assert res.more
    assert await _planned(engine, "quiet", quiet) > before
    extended = [sid for sid in noisy if await _planned(engine, "noisy", sid) > before]
    assert len(extended) == 10  # its share: 20 schedules between two tenants due
    assert res.schedules == 11  # the quiet tenant has one schedule, and used one


async def test_every_due_tenant_gets_an_equal_share(engine: Engine) -> None:
    made = {f"t{i}": await _many(engine, f"t{i}", 30, NOW + i) for i in range(4)}
    res = await engine.planner.plan(SHARD, now_ms=NOW + 3_000, limit=40)
    assert res.schedules == 40
    for tenant, sids in made.items():
        planned = [await _planned(engine, tenant, sid) for sid in sids]
        assert sum(1 for p in planned if p > 5) == 10, tenant


async def test_the_index_of_an_earlier_version_is_taken_over(engine: Engine) -> None:
    (sid,) = await _many(engine, "acme", 1, NOW)
    k, client = engine.keys, engine.client
    score = await client.zscore(k.plan(SHARD, "acme"), sid)
    assert score is not None
    # As an earlier library version left it: one index of sids for the shard.
    await client.delete(k.plan(SHARD, "acme"), k.plan_tenants(SHARD))
    await client.zadd(k.legacy_plan(SHARD), {sid: score})
    before = await _planned(engine, "acme", sid)
    res = await engine.planner.plan(SHARD, now_ms=NOW + 3_000)
    assert res.schedules == 1
    assert await _planned(engine, "acme", sid) > before
    assert await client.exists(k.legacy_plan(SHARD)) == 0
    assert await client.zscore(k.plan_tenants(SHARD), "acme") is not None


async def test_an_entry_whose_schedule_is_gone_is_dropped_and_blocks_nothing(
    engine: Engine,
) -> None:
    gone, kept = await _many(engine, "acme", 2, NOW)
    await engine.client.delete(engine.keys.schedule(SHARD, gone))
    before = await _planned(engine, "acme", kept)
    extended = 0
    for _ in range(2):  # the stale entry may come first: dropped, and the next call goes on
        extended += (await engine.planner.plan(SHARD, now_ms=NOW + 3_000, limit=1)).schedules
    assert extended == 1
    assert await _planned(engine, "acme", kept) > before
    assert await engine.client.zscore(engine.keys.plan(SHARD, "acme"), gone) is None


async def test_pause_resume_and_delete_keep_the_tenant_index(engine: Engine) -> None:
    a, b = await _many(engine, "acme", 2, NOW)
    k = engine.keys
    await engine.schedules.pause("acme", a)
    assert await engine.client.zscore(k.plan(SHARD, "acme"), a) is None
    assert await engine.client.zscore(k.plan_tenants(SHARD), "acme") is not None
    await engine.schedules.delete("acme", b)
    assert await engine.client.exists(k.plan(SHARD, "acme")) == 0
    assert await engine.client.zscore(k.plan_tenants(SHARD), "acme") is None
    await engine.schedules.resume("acme", a)
    assert await engine.client.zscore(k.plan(SHARD, "acme"), a) is not None
    assert await engine.client.zscore(k.plan_tenants(SHARD), "acme") is not None
