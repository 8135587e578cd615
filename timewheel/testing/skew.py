"""A skewed wall clock for a subprocess, with libfaketime (Debian's `faketime` package):
the process sees the true time plus an offset that a test can change while it runs (a
clock step), while Redis and the test keep the true clock.

Only the wall clock (CLOCK_REALTIME: time.time, datetime.now) is skewed. The monotonic
clock is left alone, as NTP leaves it when it steps a real host's clock; asyncio's
timers run on it.
"""

from __future__ import annotations

import glob
from pathlib import Path

LIBRARY_GLOBS = (
    "/usr/lib/*/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
)


def faketime_library() -> str:
    """The path of libfaketime.so.1. Raises RuntimeError (loudly) when it is missing."""
    for pattern in LIBRARY_GLOBS:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    raise RuntimeError("libfaketime is not installed (.ci/bootstrap installs Debian's faketime)")


class SkewedClock:
    """An offset in seconds, kept in a file libfaketime reads on every clock call."""

    def __init__(self, path: Path, offset_s: float = 0.0) -> None:
        self.path = path
        self.library = faketime_library()
        self.set(offset_s)

    def set(self, offset_s: float) -> None:
        """Step the process's wall clock to true time + offset_s, from now on."""
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(f"{offset_s:+.3f}\n")
        tmp.replace(self.path)  # the reader never sees a half-written file

    def env(self) -> dict[str, str]:
        """The environment that makes a subprocess run on this clock."""
        return {
            "LD_PRELOAD": self.library,
            "FAKETIME_TIMESTAMP_FILE": str(self.path),
            "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "FAKETIME_DONT_RESET": "1",
        }
