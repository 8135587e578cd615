"""The handler bench/worker.py runs: `timewheel worker --app worker_app:noop`, from bench/.

A no-op async handler that notes each run's due time, when the scheduler wrote it to
the stream (the envelope's dispatched_ms) and its start (the node's wall clock, in ms:
Redis runs on the same machine, so the clocks agree). The notes go to
`$TW_BENCH_NOTES.<pid>` every 0.1 s and at exit, three doubles per run, so the bench can
count the runs handled while the worker runs and read every start afterwards.
"""

from __future__ import annotations

import array
import asyncio
import atexit
import os
import threading
import time

from timewheel.models import Delivery

_notes = array.array("d")
_path = f"{os.environ.get('TW_BENCH_NOTES', '/tmp/tw-bench-notes')}.{os.getpid()}"
_lock = threading.Lock()


async def noop(delivery: Delivery) -> None:
    _notes.append(delivery.due_ms)
    _notes.append(delivery.dispatched_ms)
    _notes.append(time.time() * 1000.0)


def _flush() -> None:
    with _lock:  # the flusher thread and atexit
        n = len(_notes)
        if not n:
            return
        data = _notes[:n].tobytes()
        del _notes[:n]  # appends made meanwhile stay, in order
        with open(_path, "ab") as out:
            out.write(data)


def _flusher() -> None:
    while True:
        time.sleep(0.1)
        _flush()


_SLOW = frozenset(filter(None, os.environ.get("TW_BENCH_SLOW_TENANTS", "").split(",")))
_SLOW_S = float(os.environ.get("TW_BENCH_SLOW_S", "1.0"))


async def slow_some(delivery: Delivery) -> None:
    """noop, but the runs of the tenants in $TW_BENCH_SLOW_TENANTS take $TW_BENCH_SLOW_S
    seconds (a slow endpoint beside fast ones)."""
    await noop(delivery)
    if delivery.tenant in _SLOW:
        await asyncio.sleep(_SLOW_S)


threading.Thread(target=_flusher, name="bench-notes", daemon=True).start()
atexit.register(_flush)
