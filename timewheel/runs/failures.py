"""What a worker logs about a failed handler: one line with the traceback, rate-limited.

The level says what became of the run: warning when it will be tried again (or the
outcome was stale), error when it became a dead letter. A handler that fails every run
logs at most `per_s` lines a second (a token bucket with `per_s` tokens, refilled at
`per_s` a second); the lines left out are counted and the next line says how many.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable

import structlog

from timewheel.runs.delivery import Delivery
from timewheel.runs.signals import Retry

log = structlog.get_logger("timewheel.worker")

TRACEBACKS_PER_S = 5.0
"""Failure lines a handler may log per second (and in a burst)."""


def handler_name(handler: Callable[..., object]) -> str:
    """module:qualname of a handler (a bound method, a partial or a callable object too)."""
    target = getattr(handler, "func", handler)  # functools.partial
    module = getattr(target, "__module__", None) or type(target).__module__
    name = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{module}:{name}"


class FailureLog:
    """Logs failed attempts of one handler, at most `per_s` lines a second."""

    def __init__(
        self,
        handler: str,
        per_s: float = TRACEBACKS_PER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.handler = handler
        self.per_s = per_s
        self._clock = clock
        self._tokens = per_s
        self._stamp = clock()
        self.suppressed = 0
        """Lines left out since the last one logged."""
        self.suppressed_total = 0

    def _take(self) -> bool:
        now = self._clock()
        self._tokens = min(self.per_s, self._tokens + (now - self._stamp) * self.per_s)
        self._stamp = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        self.suppressed += 1
        self.suppressed_total += 1
        return False

    def failed(self, delivery: Delivery, exc: BaseException, outcome: str) -> bool:
        """Log a failed attempt and what became of it (retry, dead, stale, unrecorded);
        False if the rate limit left it out."""
        if self.per_s <= 0 or not self._take():
            return False
        fields: dict[str, object] = {
            "handler": self.handler,
            "run_id": delivery.run_id,
            "attempt": delivery.attempt,
            "tenant": delivery.tenant,
            "queue": delivery.queue,
            "outcome": outcome,
            "error": f"{type(exc).__name__}: {exc}",
        }
        if self.suppressed:
            fields["suppressed"] = self.suppressed
            self.suppressed = 0
        if not isinstance(exc, Retry):  # Retry is the handler's own request: no stack
            # The key structlog's format_exc_info writes: the console renderer prints it
            # below the line, the JSON renderer as a string field.
            fields["exception"] = "".join(traceback.format_exception(exc)).rstrip()
        if outcome == "dead":
            log.error("handler_failed", **fields)
        else:
            log.warning("handler_failed", **fields)
        return True
