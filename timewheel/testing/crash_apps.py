"""Handlers for the crash tests: `timewheel worker --app timewheel.testing.crash_apps:record`.

Each worker process appends one line per handled run to its own file, $TW_CRASH_LOG:
`<run_id> <attempt> ok` just before the handler returns (the worker then acks), or
`<run_id> <attempt> fail` before it raises. A line is one write(2) on an O_APPEND file, so
a process killed with SIGKILL leaves whole lines only. A run id listed `ok` twice was
handled twice (at-least-once: the worker died before its ack reached Redis, or the lease
expired while the handler ran).
"""

from __future__ import annotations

import asyncio
import os
import random

from timewheel.models import Delivery

_fd: int | None = None


def _log_fd() -> int:
    global _fd
    if _fd is None:
        _fd = os.open(os.environ["TW_CRASH_LOG"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    return _fd


async def record(delivery: Delivery) -> None:
    """Work 1-5 ms, note the run, succeed; a payload with "doomed": true always fails."""
    await asyncio.sleep(random.uniform(0.001, 0.005))
    payload = delivery.payload
    doomed = isinstance(payload, dict) and payload.get("doomed") is True
    outcome = "fail" if doomed else "ok"
    os.write(_log_fd(), f"{delivery.run_id} {delivery.attempt} {outcome}\n".encode())
    if doomed:
        raise RuntimeError("doomed by the test")
