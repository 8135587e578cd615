"""Listing a tenant's schedules page by page, on standalone and Cluster."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from timewheel.engine import Engine
from timewheel.errors import ValidationError
from timewheel.schedules.listing import list_schedules
from timewheel.schedules.model import NewSchedule
from timewheel.testing.clock import NOW
from timewheel.testing.schedules import every
from timewheel.testing.settings import test_settings


@pytest.fixture
async def spread_engine(redis_url: str) -> AsyncIterator[Engine]:
    """Tenants spread over 4 shards, so a listing crosses shards."""
    eng = await Engine.connect(test_settings(redis_url, default_spread=4))
    try:
        yield eng
    finally:
        await eng.close()


async def _make(engine: Engine, tenant: str, n: int) -> set[str]:
    out = set()
    for _ in range(n):
        sched, _ = await engine.schedules.create(
            NewSchedule(tenant=tenant, spec=every(60)), now_ms=NOW
        )
        out.add(sched.id)
    return out


async def _all_pages(engine: Engine, tenant: str, limit: int) -> list[str]:
    ids: list[str] = []
    cursor = None
    for _ in range(100):
        items, cursor = await list_schedules(engine.store, tenant, limit=limit, cursor=cursor)
        assert len(items) <= limit
        assert all(s.tenant == tenant for s in items)
        ids.extend(s.id for s in items)
        if cursor is None:
            return ids
    raise AssertionError("the cursor never ended")


async def test_pages_hold_each_schedule_of_the_tenant_once(spread_engine: Engine) -> None:
    engine = spread_engine
    mine = await _make(engine, "acme", 9)
    # Tenants sharing acme's shards: their schedules are in the same sets, never listed.
    neighbours = [
        t
        for t in (f"n{i}" for i in range(500))
        if set(engine.store.shards_of(t)) & set(engine.store.shards_of("acme"))
    ][:3]
    for t in neighbours:
        await _make(engine, t, 2)
    for limit in (1, 2, 4, 100):
        ids = await _all_pages(engine, "acme", limit)
        assert sorted(ids) == sorted(mine), limit
    gone = sorted(mine)[0]
    await engine.schedules.delete("acme", gone, now_ms=NOW)
    assert sorted(await _all_pages(engine, "acme", 3)) == sorted(mine - {gone})
    assert await _all_pages(engine, "nobody", 10) == []


async def test_a_foreign_or_bad_cursor_is_refused(spread_engine: Engine) -> None:
    for bad in ("x", "1", "a.b.c"):
        with pytest.raises(ValidationError) as err:
            await list_schedules(spread_engine.store, "acme", cursor=bad)
        assert err.value.field == "cursor"
