"""Deadlines checked once per tick (timewheel/store/deadlines.py): what asyncio.timeout
does for an exchange with Redis, a tick late at most."""

from __future__ import annotations

import asyncio
import time

import pytest

from timewheel.store.deadlines import Deadlines

TICK_S = 0.05


async def _exchange(deadlines: Deadlines, work: float) -> str:
    """An exchange that takes `work` seconds under `deadlines`."""
    with deadlines:
        await asyncio.sleep(work)
        return "done"


async def test_an_exchange_in_time_ends_as_it_would_without_a_deadline() -> None:
    deadlines = Deadlines(1.0, TICK_S)
    assert await _exchange(deadlines, 0.01) == "done"
    assert not deadlines._due and not deadlines._expired
    await asyncio.sleep(3 * TICK_S)
    assert deadlines._timer is None  # nothing pending: the check stopped arming itself


async def test_a_late_exchange_raises_timeout_within_a_tick_of_its_deadline() -> None:
    deadlines = Deadlines(0.1, TICK_S)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await _exchange(deadlines, 10.0)
    elapsed = time.monotonic() - started
    assert 0.1 <= elapsed < 0.1 + TICK_S + 0.5  # the bound is loose: a loaded host is slow
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # the deadline's cancel is undone
    assert not deadlines._due and not deadlines._expired


async def test_the_task_goes_on_after_a_timeout() -> None:
    deadlines = Deadlines(0.05, TICK_S)
    with pytest.raises(TimeoutError):
        await _exchange(deadlines, 10.0)
    await asyncio.sleep(0.01)  # not cancelled: an await after the timeout runs
    assert await _exchange(deadlines, 0.01) == "done"


async def test_a_cancel_from_outside_is_a_cancel_not_a_timeout() -> None:
    deadlines = Deadlines(10.0, TICK_S)
    task = asyncio.create_task(_exchange(deadlines, 10.0))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not deadlines._due and not deadlines._expired


async def test_a_cancel_from_outside_as_the_deadline_passes_stays_a_cancel() -> None:
    """Both asked to cancel the task: as asyncio.timeout does, the outside cancel wins."""
    deadlines = Deadlines(0.05, TICK_S)
    task = asyncio.create_task(_exchange(deadlines, 10.0))
    await asyncio.sleep(0.01)
    deadlines._check(asyncio.get_running_loop())  # not yet due: nothing happens
    assert not task.done()
    deadlines._due[task] = (0.0, 0)  # now it is due
    deadlines._check(asyncio.get_running_loop())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_concurrent_exchanges_each_keep_their_own_deadline() -> None:
    """Each counts from its own start: the later ones end past the first's deadline but
    within their own."""
    deadlines = Deadlines(0.3, TICK_S)
    late = asyncio.create_task(_exchange(deadlines, 10.0))
    await asyncio.sleep(0.2)
    later = [asyncio.create_task(_exchange(deadlines, 0.2)) for _ in range(3)]
    with pytest.raises(TimeoutError):
        await late
    assert [await t for t in later] == ["done"] * 3


async def test_a_task_holds_one_deadline_at_a_time() -> None:
    deadlines = Deadlines(1.0, TICK_S)
    with deadlines, pytest.raises(RuntimeError):
        deadlines.__enter__()
    assert not deadlines._due


def test_a_deadline_checks_on_each_loop_it_is_used_on() -> None:
    """A Deadlines used on one loop, then on another (a process's next asyncio.run), arms
    a timer on the new loop: a deadline there still fires."""
    deadlines = Deadlines(0.05, TICK_S)
    assert asyncio.run(_exchange(deadlines, 0.01)) == "done"

    async def late() -> None:
        with pytest.raises(TimeoutError):
            await _exchange(deadlines, 10.0)

    asyncio.run(late())
