"""Clocks for tests that must not wait: a fixed instant, and a clock that moves only when
told to.

Every operation that decides by time takes a clock override, `now_ms=`, in place of the
server's TIME: TaskOps.create/cancel/update, Dispatch.tick/promote/expire/reap,
Outcomes.ack/fail, every ScheduleOps call and Planner.plan. A test passes
`now_ms=clock.now_ms` to them and calls `clock.advance(ms)` where it would otherwise
sleep: it takes no time and always gives the same answer.

What a server measures itself (a key's TTL, a pending entry's idle time), the scheduler
loop, and other processes keep to the real clock; a fake one does not move them.
"""

from __future__ import annotations

import time

NOW = 1_800_000_000_000
"""A fixed shard clock for deterministic tests: 2027-01-15T08:00:00Z, a whole second."""


class FakeClock:
    """A shard clock in milliseconds that moves only by `advance` (or `set`)."""

    def __init__(self, start_ms: int = NOW) -> None:
        self.now_ms = start_ms

    @classmethod
    def from_wall_clock(cls) -> FakeClock:
        """A clock starting at the real time now: for tasks that were created on the
        server's clock (through the API, say) and are then moved on by this one."""
        return cls(int(time.time() * 1000))

    def advance(self, ms: int) -> int:
        """Let `ms` milliseconds go by (never backwards); returns the new time."""
        if ms < 0:
            raise ValueError(f"a clock does not advance by {ms} ms; set() steps it back")
        self.now_ms += ms
        return self.now_ms

    def set(self, ms: int) -> int:
        """Step the clock to `ms`, forwards or backwards (a clock adjusted under a node)."""
        self.now_ms = ms
        return self.now_ms

    def after(self, ms: int) -> int:
        """The time `ms` milliseconds from now, without moving the clock."""
        return self.now_ms + ms

    def __repr__(self) -> str:
        return f"FakeClock(now_ms={self.now_ms})"
