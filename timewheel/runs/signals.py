"""What a handler raises to steer its run's outcome, besides returning (success) or any
other exception (a failed attempt, retried by the policy's backoff)."""

from __future__ import annotations

from timewheel.errors import PermanentError

__all__ = ["PermanentError", "Retry"]


class Retry(Exception):
    """Raise from a handler to retry the run after `delay_s` (None: the policy's backoff)."""

    def __init__(self, delay_s: float | None = None, reason: str = "retry requested"):
        super().__init__(reason)
        self.delay_s = delay_s
        self.reason = reason
