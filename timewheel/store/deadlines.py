"""Deadlines for the short exchanges with Redis that a process makes by the thousand.

`asyncio.timeout` arms a timer for every use and enters and leaves an async context
manager: about 27,000 instructions, an eighth of the caller's work on a single create
(`bench/engine_create.py --callgrind`). A `Deadlines` keeps the deadline of each task in
an exchange in a dict and checks them all from one timer a second, armed while any is
pending: an exchange costs a dict entry, and its deadline fires up to `tick_s` late
(a deadline of 30 s fires by 31 s).

    deadlines = Deadlines(SOCKET_TIMEOUT_S)  # one per lane or wire
    ...
    with deadlines:
        ...  # awaits that must end within SOCKET_TIMEOUT_S: TimeoutError if they do not

A plain context manager, shared by the tasks that use it: it keys each deadline by the
current task, and a CancelledError raised at an await in its body reaches its __exit__
as any exception does. A task holds one deadline of a `Deadlines` at a time (exchanges
do not nest).
"""

from __future__ import annotations

import asyncio
from typing import Any

TICK_S = 1.0
"""How often pending deadlines are checked: how late one may fire."""


class Deadlines:
    """The pending deadlines of tasks exchanging with Redis, each `seconds` from its
    start, checked once per `tick_s`."""

    def __init__(self, seconds: float, tick_s: float = TICK_S) -> None:
        self.seconds = seconds
        self.tick_s = tick_s
        self._due: dict[asyncio.Task[Any], tuple[float, int]] = {}
        """task -> (its deadline on the loop's clock, its cancel requests when it entered)"""
        self._expired: dict[asyncio.Task[Any], int] = {}
        """tasks cancelled by their deadline -> their cancel requests when they entered"""
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        """the loop the timer is armed on (a new loop, as in tests, arms its own)"""

    def __enter__(self) -> None:
        """Start the current task's deadline.

        Raises:
            RuntimeError: outside a task, or the task already has a deadline here.
        """
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a deadline needs a running task")
        if task in self._due:
            raise RuntimeError("a task holds one deadline of a Deadlines at a time")
        loop = task.get_loop()
        self._due[task] = (loop.time() + self.seconds, task.cancelling())
        if self._timer is None or self._loop is not loop:
            self._timer, self._loop = loop.call_later(self.tick_s, self._check, loop), loop

    def __exit__(self, kind: type[BaseException] | None, exc: object, tb: object) -> None:
        """End the current task's deadline. When its body ends in a CancelledError:
        raise TimeoutError if the deadline cancelled it and nothing else asked to cancel
        it too (then the CancelledError goes on, as with asyncio.timeout)."""
        task = asyncio.current_task()
        assert task is not None
        self._due.pop(task, None)
        cancelling = self._expired.pop(task, None)
        if (
            kind is asyncio.CancelledError
            and cancelling is not None
            and task.uncancel() <= cancelling
        ):
            raise TimeoutError("no reply from Redis in time") from None

    def _check(self, loop: asyncio.AbstractEventLoop) -> None:
        if loop is not self._loop:
            return  # a timer of an earlier loop
        self._timer = None
        now = loop.time()
        for task, (deadline, cancelling) in list(self._due.items()):
            if task.get_loop() is loop and deadline <= now:
                del self._due[task]
                if task.cancel():
                    self._expired[task] = cancelling
        if self._due:
            self._timer = loop.call_later(self.tick_s, self._check, loop)
