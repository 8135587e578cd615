"""FakeClock: a shard clock that moves only when told to."""

from __future__ import annotations

import time

import pytest

from timewheel.testing.clock import NOW, FakeClock


def test_it_starts_at_now_and_moves_only_when_told() -> None:
    clock = FakeClock()
    assert clock.now_ms == NOW and NOW % 1000 == 0
    time.sleep(0.01)
    assert clock.now_ms == NOW  # real time going by does not move it
    assert clock.advance(1500) == NOW + 1500 == clock.now_ms
    assert clock.after(500) == NOW + 2000 and clock.now_ms == NOW + 1500
    assert clock.advance(0) == NOW + 1500


def test_it_never_advances_backwards_but_can_be_stepped_back() -> None:
    clock = FakeClock(10_000)
    with pytest.raises(ValueError, match="set"):
        clock.advance(-1)
    assert clock.now_ms == 10_000
    assert clock.set(8_500) == 8_500 == clock.now_ms  # a clock adjusted under a node
    assert repr(clock) == "FakeClock(now_ms=8500)"


def test_from_wall_clock_starts_at_the_real_time() -> None:
    before = int(time.time() * 1000)
    clock = FakeClock.from_wall_clock()
    after = int(time.time() * 1000)
    assert before <= clock.now_ms <= after
