"""Listing a tenant's tasks (timewheel/tasks/listing.py) on standalone Redis and on Cluster."""

from __future__ import annotations

import pytest

from timewheel.engine import Engine
from timewheel.errors import ValidationError
from timewheel.tasks.listing import list_tasks
from timewheel.tasks.model import NewTask


async def _all(engine: Engine, tenant: str, limit: int, **filters: str) -> list[str]:
    seen: list[str] = []
    cursor: str | None = None
    for _ in range(1000):  # bounded
        items, cursor = await list_tasks(
            engine.store, tenant, limit=limit, cursor=cursor, **filters
        )
        assert len(items) <= limit
        seen.extend(t.id for t in items)
        if cursor is None:
            return seen
    raise AssertionError("the cursor never ended")


async def test_pages_filters_and_tenants(engine: Engine) -> None:
    mine = [
        (
            await engine.tasks.create(NewTask("acme", queue="a" if i % 2 else "b", delay_ms=60_000))
        ).task_id
        for i in range(30)
    ]
    for _ in range(10):
        await engine.tasks.create(NewTask("globex", delay_ms=60_000))
    await engine.tasks.cancel("acme", mine[0])
    listed = await _all(engine, "acme", 7)
    assert sorted(listed) == sorted(mine) and len(set(listed)) == len(listed)
    assert sorted(await _all(engine, "acme", 1000, queue="a")) == sorted(mine[1::2])
    assert await _all(engine, "acme", 5, state="cancelled") == [mine[0]]
    assert await _all(engine, "nobody", 10) == []


async def test_a_foreign_cursor_is_refused(engine: Engine) -> None:
    with pytest.raises(ValidationError):
        await list_tasks(engine.store, "acme", cursor="0.2000000.0.")  # past a walk's end
