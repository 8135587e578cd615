"""Every exception timewheel raises, in one tree.

    TimewheelError
    ├── ConfigError               settings or environment unusable (missing binary, bad URL)
    │   └── RestoreRefused        restore would write into a Redis that already holds data
    ├── PermanentError            raised by a handler: the run cannot succeed, dead-letter it
    ├── RedisUnavailable          Redis could not be reached or answered with a server error
    ├── PostgresUnavailable       PostgreSQL could not be reached or a statement failed
    ├── ValidationError           a request field is malformed (HTTP 400/413/422)
    │   ├── PayloadTooLarge       payload over the configured limit (HTTP 413)
    │   └── InvalidSchedule       a cron expression, time zone or time window cannot work
    └── ScriptError               a Lua operation returned an expected negative outcome
        ├── TaskNotFound          no such task for this tenant (HTTP 404)
        ├── InvalidState          the task is not in a state that allows the change (HTTP 409)
        └── LeaseLost             the caller no longer holds the shard lease (scheduler)

Each exception names the value it is about. `timewheel.api.errors` maps this tree to
HTTP status codes in one place.
"""

from __future__ import annotations


class TimewheelError(Exception):
    """Root of every error timewheel raises on purpose."""


class ConfigError(TimewheelError):
    """Raised when settings or the environment cannot work (bad URL, missing redis-server)."""


class RestoreRefused(ConfigError):
    """Raised when `timewheel restore` finds keys in the target Redis and --force is not set,
    or finds no complete snapshot to restore from."""


class PostgresUnavailable(TimewheelError):
    """Raised when PostgreSQL (archiver, snapshot, restore, history fallback) cannot be
    reached, refuses the login, or fails a statement."""


class PermanentError(TimewheelError):
    """Raise from an executor handler when retrying cannot help: the run is dead-lettered."""


class RedisUnavailable(TimewheelError):
    """Raised when Redis cannot be reached, times out, or is in a state we cannot use."""


class ValidationError(TimewheelError):
    """Raised when a request field is malformed; `field` names it, `code` is stable."""

    code = "invalid"

    def __init__(self, message: str, *, field: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field
        if code is not None:
            self.code = code


class PayloadTooLarge(ValidationError):
    """Raised when a payload's encoded size exceeds the configured limit."""

    code = "payload_too_large"


class InvalidSchedule(ValidationError):
    """Raised when a schedule's cron, time zone, interval or start/end cannot work."""


class ScriptError(TimewheelError):
    """Raised when a Lua operation answers with one of its documented negative codes."""

    code = "script_error"


class TaskNotFound(ScriptError):
    """Raised when a task id is unknown, or belongs to another tenant (never distinguished)."""

    code = "not_found"

    def __init__(self, task_id: str):
        super().__init__(f"task {task_id!r} not found")
        self.task_id = task_id


class InvalidState(ScriptError):
    """Raised when a change needs state `scheduled` (cancel, reschedule) but the task is past it."""

    code = "invalid_state"

    def __init__(self, task_id: str, state: str, action: str):
        super().__init__(f"task {task_id!r} is {state}; {action} needs state 'scheduled'")
        self.task_id = task_id
        self.state = state
        self.action = action


class LeaseLost(ScriptError):
    """Raised when a scheduler call finds that its node no longer holds the shard's lease."""

    code = "lease_lost"

    def __init__(self, shard: int):
        super().__init__(f"lease on shard {shard} lost")
        self.shard = shard
