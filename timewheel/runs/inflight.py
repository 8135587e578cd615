"""The runs a worker holds, counted, and the bound on them that holds its reader back.

The reader, the runners, the lease keeper and the outcome recorder each move one of
these counts; the reader waits on `wait_for_room` and whoever frees room wakes it. The
counts are plain attributes, changed in place on every run's path (no call, no lock).
"""

from __future__ import annotations

import asyncio

UNACKED_BOUND = 1024
"""Runs handled whose outcome is not yet recorded, past which the reader waits (Redis
slower at recording than the handlers at handling)."""


class InFlight:
    """Runs read and not yet done, and how many more the reader may read."""

    __slots__ = ("capacity", "held_bound", "outstanding", "owned", "read_min", "waiting")

    def __init__(self) -> None:
        self.outstanding = 0
        """Runs read whose handler has not finished (read ahead, or running)."""
        self.owned = 0
        """Runs held: read, their outcome not yet recorded (the lease keeper keeps them)."""
        self.capacity = 0
        """Handler slots plus the read-ahead now."""
        self.held_bound = 0
        """Runs held past which the reader waits."""
        self.read_min = 1
        """The reader waits until this many runs may be read (or nothing is in flight)."""
        self.waiting: asyncio.Future[None] | None = None
        """The reader's wait for room, while it waits."""

    def set_capacity(self, capacity: int) -> None:
        self.capacity = capacity
        self.held_bound = capacity + UNACKED_BOUND
        self.read_min = max(1, capacity // 4)

    def room(self) -> int:
        """Runs the reader may read now: free handler slots plus the prefetch, within the
        bound on runs held (read and not yet recorded)."""
        return min(self.capacity - self.outstanding, self.held_bound - self.owned)

    async def wait_for_room(self) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self.waiting = waiter
        try:
            await waiter
        finally:
            self.waiting = None

    def wake_reader(self) -> None:
        waiter = self.waiting
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
