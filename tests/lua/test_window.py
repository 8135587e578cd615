"""A task's `window_s` spreads its due time over [run_at, run_at + window], on standalone
and Cluster."""

from __future__ import annotations

from collections import Counter

import pytest

from timewheel.engine import Engine
from timewheel.errors import ValidationError
from timewheel.tasks.model import NewTask
from timewheel.testing.clock import NOW


async def test_a_window_spreads_a_herd_evenly_over_it(engine: Engine) -> None:
    run_at, window_ms = NOW + 10_000, 60_000
    herd = [
        NewTask(tenant="herd", run_at_ms=run_at, options={"window_s": window_ms / 1000})
        for _ in range(3000)
    ]
    created = await engine.tasks.create_many(herd)
    due = [c.due_ms for c in created]
    assert all(run_at <= d <= run_at + window_ms for d in due)
    # Six 10 s slices of the window: ~500 each (binomial sd ~20); a herd at one instant
    # would put all 3000 in the first.
    slices = Counter((d - run_at) * 6 // (window_ms + 1) for d in due)
    assert sorted(slices) == [0, 1, 2, 3, 4, 5]
    assert all(380 <= n <= 620 for n in slices.values()), slices
    assert len(set(due)) > 2500
    task = await engine.tasks.get("herd", created[0].task_id)
    assert task.due_ms == created[0].due_ms  # the time chosen is the task's due time


async def test_a_window_keeps_an_idempotent_create_at_one_time(engine: Engine) -> None:
    def new() -> NewTask:
        return NewTask(
            tenant="idem",
            run_at_ms=NOW + 5000,
            idempotency_key="nightly-sync",
            options={"window_s": 3600},
        )

    first = await engine.tasks.create(new())
    again = await engine.tasks.create(new())
    assert not again.created and again.task_id == first.task_id
    assert again.due_ms == first.due_ms
    plain = await engine.tasks.create(NewTask(tenant="idem", run_at_ms=NOW + 5000))
    assert plain.due_ms == NOW + 5000  # no window, no spread


async def test_a_window_applies_to_a_delay_too(engine: Engine) -> None:
    res = [
        await engine.tasks.create(
            NewTask(tenant="later", delay_ms=1000, options={"window_s": 10}), now_ms=NOW
        )
        for _ in range(50)
    ]
    assert all(NOW + 1000 <= r.due_ms <= NOW + 11_000 for r in res)
    assert len({r.due_ms for r in res}) > 40


@pytest.mark.parametrize("window", [-1, "60", True, 86_401, float("nan")])
async def test_a_bad_window_is_refused(engine: Engine, window: object) -> None:
    with pytest.raises(ValidationError) as bad:
        await engine.tasks.create(
            NewTask(tenant="bad", run_at_ms=NOW + 1000, options={"window_s": window})
        )
    assert bad.value.field == "window_s"
