"""RedisClock: this process's estimate of Redis's time, on a monotonic base."""

from __future__ import annotations

from timewheel.store.clock import RedisClock


class Clocks:
    """A monotonic and a wall clock a test moves by hand."""

    def __init__(self, wall_ms: float) -> None:
        self.mono = 1_000.0
        self.wall = wall_ms

    def advance(self, ms: float) -> None:
        self.mono += ms
        self.wall += ms

    def clock(self) -> RedisClock:
        return RedisClock(monotonic=lambda: self.mono, wall=lambda: self.wall)


REDIS = 1_800_000_000_000.0


def test_before_any_reply_the_wall_clock_stands_in() -> None:
    clocks = Clocks(REDIS + 5)
    clock = clocks.clock()
    assert not clock.known and clock.now_ms() == REDIS + 5


def test_the_estimate_follows_redis_not_a_stepping_wall_clock() -> None:
    clocks = Clocks(REDIS + 30_000)  # 30 s ahead
    clock = clocks.clock()
    sent = clock.sent()
    clocks.advance(2)
    clock.observe(REDIS + 1, sent)  # read mid-way through a 2 ms round trip
    assert clock.now_ms() == REDIS + 2
    assert round(clock.skew_ms) == -30_000
    clocks.advance(1_000)
    clocks.wall -= 3_600_000  # the wall clock steps back an hour: nothing changes
    assert clock.now_ms() == REDIS + 1_002


def test_a_slow_reply_does_not_spoil_a_tight_estimate() -> None:
    clocks = Clocks(REDIS)
    clock = clocks.clock()
    sent = clock.sent()
    clocks.advance(2)
    clock.observe(REDIS + 1, sent)
    # A 400 ms round trip whose TIME was read near its end: 199 ms off at its midpoint.
    sent = clock.sent()
    clocks.advance(400)
    clock.observe(REDIS + 2 + 399, sent)
    assert clock.now_ms() == REDIS + 402
    # A tighter sample later is taken, though.
    sent = clock.sent()
    clocks.advance(1)
    clock.observe(REDIS + 402.5 + 3, sent)  # Redis moved 3 ms against this base
    assert clock.now_ms() == REDIS + 403 + 3


def test_a_sample_that_contradicts_the_estimate_replaces_it() -> None:
    clocks = Clocks(REDIS)
    clock = clocks.clock()
    sent = clock.sent()
    clocks.advance(2)
    clock.observe(REDIS + 1, sent)
    # The base itself moved (a faked monotonic clock): a slow sample, 10 s off, wins.
    sent = clock.sent()
    clocks.advance(100)
    clock.observe(REDIS + 10_000, sent)
    assert abs(clock.now_ms() - (REDIS + 10_050)) < 1
