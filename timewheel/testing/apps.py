"""Handlers that tests run with `timewheel worker --app timewheel.testing.apps:<name>`."""

from __future__ import annotations

import os
import time
from pathlib import Path

from timewheel.models import Delivery


def sleepy(delivery: Delivery) -> None:
    """Note the delivery in $TW_TEST_MARKER, then work for a minute (to be killed)."""
    Path(os.environ["TW_TEST_MARKER"]).write_text(f"{delivery.run_id} {delivery.attempt}\n")
    time.sleep(60)
