"""Waiting in tests: poll a condition until it holds, or fail saying what never happened."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def until(what: str, check: Callable[[], Awaitable[bool]], timeout_s: float = 60) -> None:
    """Poll `check` every 0.1 s until it is true; AssertionError naming `what` after
    `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, f"timed out: {what}"
        await asyncio.sleep(0.1)
