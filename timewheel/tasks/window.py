"""Spreading herds on purpose (docs/concepts/tasks.md, spreading a herd).

A task's `window_s` makes its run due at a time in [run_at, run_at + window_s]; a
schedule's `jitter_s` makes every run of it due a fixed offset in [0, jitter_s] after
its fire time. Either way the offset comes from a hash of the id: uniform over many
tasks or schedules, so 100,000 of them due at midnight come due over the window instead
of in one instant, and fixed per id, so an idempotent retry lands at the same time and
a schedule's runs stay evenly spaced.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping

from timewheel.errors import ValidationError
from timewheel.models import JSONValue

MAX_SPREAD_S = 86_400
"""Longest window_s or jitter_s."""


def offset_ms(key: str, spread_ms: int) -> int:
    """A stable offset in [0, spread_ms] for `key`."""
    if spread_ms <= 0:
        return 0
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % (spread_ms + 1)


def option_ms(options: Mapping[str, JSONValue], name: str) -> int:
    """The spread option `name` (seconds) of `options` in ms; 0 without one.
    Raises ValidationError (with the field) for anything but a number in range."""
    value = options.get(name)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValidationError(f"{name} must be a number", field=name)
    if not 0 <= value <= MAX_SPREAD_S:
        raise ValidationError(f"{name} must be between 0 and {MAX_SPREAD_S}", field=name)
    return round(value * 1000)
