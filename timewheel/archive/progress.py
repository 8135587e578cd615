"""How `timewheel restore` shows its progress on stderr: a progress bar (rich) when
stderr is a terminal, else a structlog line at most every LOG_EVERY_S and after the last
step (log collectors get lines, not redrawn bars)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

import structlog
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from timewheel.archive.restore import Progress as Steps

log = structlog.get_logger("timewheel.restore")

LOG_EVERY_S = 5.0


class BarProgress:
    """A rich progress bar of the steps, with the counts so far."""

    def __init__(self, stream: TextIO) -> None:
        self._bar = Progress(
            TextColumn("restore {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[counts]}"),
            TimeElapsedColumn(),
            console=Console(file=stream),
            transient=True,
        )
        self._task = self._bar.add_task("", total=None, counts="")
        self._totals: dict[str, int] = {}

    def begin(self, steps: int) -> None:
        self._bar.start()
        self._bar.update(self._task, total=steps)

    def step(self, what: str, **counts: int) -> None:
        for name, n in counts.items():
            self._totals[name] = self._totals.get(name, 0) + n
        text = ", ".join(f"{n} {name}" for name, n in self._totals.items())
        self._bar.update(self._task, advance=1, description=what, counts=text)

    def end(self) -> None:
        self._bar.stop()


class LogProgress:
    """A `restore_progress` log line at most every `every_s`, and after the last step."""

    def __init__(self, every_s: float = LOG_EVERY_S) -> None:
        self.every_s = every_s
        self._steps = self._done = 0
        self._next = 0.0
        self._totals: dict[str, int] = {}

    def begin(self, steps: int) -> None:
        self._steps, self._done = steps, 0
        self._next = time.monotonic() + self.every_s

    def step(self, what: str, **counts: int) -> None:
        self._done += 1
        for name, n in counts.items():
            self._totals[name] = self._totals.get(name, 0) + n
        now = time.monotonic()
        if now >= self._next or self._done == self._steps:
            self._next = now + self.every_s
            log.info(
                "restore_progress", step=what, done=self._done, steps=self._steps, **self._totals
            )

    def end(self) -> None:
        pass


def for_stderr(stream: TextIO | None = None) -> Steps:
    """A bar on a terminal, log lines otherwise."""
    stream = sys.stderr if stream is None else stream
    if stream.isatty():
        return BarProgress(stream)
    return LogProgress()
