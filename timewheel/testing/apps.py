"""Handlers that tests run with `timewheel worker --app timewheel.testing.apps:<name>`."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from timewheel.errors import PermanentError
from timewheel.models import Delivery


def sleepy(delivery: Delivery) -> None:
    """Note the delivery in $TW_TEST_MARKER, then work for a minute (to be killed)."""
    Path(os.environ["TW_TEST_MARKER"]).write_text(f"{delivery.run_id} {delivery.attempt}\n")
    time.sleep(60)


async def note(delivery: Delivery) -> None:
    """Work $TW_TEST_SLEEP_S seconds (default 0), then append `<run_id> <attempt> <pid>` to
    $TW_TEST_LOG: one write(2) on an O_APPEND file, so a killed process leaves whole lines,
    and a line means the handler returned (the worker acks after it)."""
    await asyncio.sleep(float(os.environ.get("TW_TEST_SLEEP_S", "0")))
    fd = os.open(os.environ["TW_TEST_LOG"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, f"{delivery.run_id} {delivery.attempt} {os.getpid()}\n".encode())
    finally:
        os.close(fd)


async def drill(delivery: Delivery) -> None:
    """`note`, except that a payload {"fail": true} fails for good (a dead letter) while
    the file $TW_TEST_HEALED does not exist."""
    payload = delivery.payload
    healed = Path(os.environ.get("TW_TEST_HEALED", "")).exists()
    if isinstance(payload, dict) and payload.get("fail") and not healed:
        raise PermanentError("drill: refused")
    await note(delivery)
