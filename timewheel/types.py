"""Values every part of timewheel shares: run states, schedule policies, JSON, times."""

from __future__ import annotations

import time
from collections.abc import Mapping
from enum import IntEnum, StrEnum
from typing import Any, Literal, get_args

JSONValue = Any
"""Any value `json.loads` can return."""


class TaskState(IntEnum):
    """States of a run (docs/concepts/states.md), as the integers the records hold."""

    SCHEDULED = 0
    DISPATCHED = 1
    SUCCEEDED = 2
    CANCELLED = 3
    DEAD = 4
    SKIPPED = 5
    """A schedule's run that was not sent: a misfire under its catchup policy, or overlap."""

    @property
    def label(self) -> str:
        """The state's name in the API, the SDK and the event log."""
        return self.name.lower()


StateName = Literal["scheduled", "dispatched", "succeeded", "cancelled", "dead", "skipped"]
"""A state's label as the SDK types it: the same names as TaskState (checked below)."""

STATES: tuple[str, ...] = tuple(state.label for state in TaskState)
"""Every state label, in TaskState order."""

if get_args(StateName) != STATES:  # pragma: no cover - a mismatch fails at import
    raise AssertionError(f"StateName {get_args(StateName)} does not match TaskState {STATES}")


class Catchup(StrEnum):
    """What a schedule does with fire times missed by more than the misfire threshold."""

    SKIP = "skip"
    LATEST = "latest"
    ALL = "all"


class Overlap(StrEnum):
    """What a schedule does with a fire time while its previous run is still in flight."""

    ALLOW = "allow"
    SKIP = "skip"
    BUFFER_ONE = "buffer_one"


CATCHUPS: tuple[str, ...] = tuple(c.value for c in Catchup)
OVERLAPS: tuple[str, ...] = tuple(o.value for o in Overlap)


def ms_to_rfc3339(ms: int) -> str:
    """Epoch milliseconds as an RFC 3339 UTC string with millisecond precision (integer
    arithmetic: exact, and cheaper than a datetime; every task answer holds two)."""
    seconds, millis = divmod(ms, 1000)
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(seconds))}.{millis:03d}Z"


def optional_rfc3339(ms: int | None) -> str | None:
    """ms_to_rfc3339, with None for no time."""
    return None if ms is None else ms_to_rfc3339(ms)


SCAN_CURSOR_MAX = 2**64 - 1
"""The largest cursor SCAN, SSCAN and HSCAN take, and the largest part of a stream entry
id: a larger one is a Redis error, and a listing cursor holding one was not given out by
the API."""


def text(value: object) -> str:
    """A Redis reply value (bytes, or anything else) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


def field_text(fields: Mapping[bytes, bytes], name: str) -> str | None:
    """A stream entry's or hash's field as text; None when it is missing or empty."""
    value = fields.get(name.encode())
    return None if value is None or value == b"" else value.decode()


def field_int(fields: Mapping[bytes, bytes], name: str) -> int | None:
    """A stream entry's or hash's field as an integer; None when it is missing or empty."""
    value = fields.get(name.encode())
    return None if value is None or value == b"" else int(value)
