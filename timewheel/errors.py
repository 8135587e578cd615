"""Every exception timewheel raises, in one tree.

    TimewheelError
    ├── ConfigError               settings or environment unusable (missing binary, bad URL)
    │   └── RestoreRefused        restore would write into a Redis that already holds data
    ├── PermanentError            raised by a handler: the run cannot succeed, dead-letter it
    ├── RedisUnavailable          Redis could not be reached or answered with a server error
    │   └── ReplicasBehind        a write ran, but too few replicas confirmed it in time
    ├── Unauthorized              no API key, or one that is unknown or revoked (HTTP 401)
    ├── Forbidden                 the key's role does not allow the endpoint (HTTP 403)
    ├── NotFound                  no such tenant, key, task or schedule (HTTP 404)
    │   └── TaskNotFound          no such task or schedule for this tenant
    ├── Conflict                  the change cannot be made as things are (HTTP 409)
    │   └── InvalidState          the task is not in a state that allows the change
    ├── OverLimit                 the tenant is over one of its limits (HTTP 429)
    ├── StorageFull               Redis is near its memory ceiling: creates refused (HTTP 507)
    ├── ApiError, TransportError  the SDK's errors (timewheel/sdk/errors.py)
    ├── PostgresUnavailable       PostgreSQL could not be reached or a statement failed
    ├── ValidationError           a request field is malformed (HTTP 400/413/422)
    │   ├── PayloadTooLarge       payload over the configured limit (HTTP 413)
    │   └── InvalidSchedule       a cron expression, time zone or time window cannot work
    └── ScriptError               a Lua operation answered what its caller cannot use
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


class ReplicasBehind(RedisUnavailable):
    """Raised when a write reached the primary but fewer replicas than min_replicas_ack
    confirmed it within replica_wait_ms (HTTP 503: retry with the same idempotency key)."""


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


class NotFound(TimewheelError):
    """Raised when a tenant, an API key id, a task or a schedule is unknown."""

    code = "not_found"


class Conflict(TimewheelError):
    """Raised when a change conflicts with what is stored: a tenant id taken, a task past
    the state the change needs."""

    code = "conflict"


class TaskNotFound(NotFound):
    """Raised when a task id is unknown, or belongs to another tenant (never distinguished)."""

    code = "not_found"

    def __init__(self, task_id: str):
        super().__init__(f"task {task_id!r} not found")
        self.task_id = task_id


class InvalidState(Conflict):
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


class Unauthorized(TimewheelError):
    """Raised when a request has no API key, or one that is unknown or revoked."""

    code = "unauthorized"


class Forbidden(TimewheelError):
    """Raised when the key is valid but its role may not use the endpoint (tenant vs admin)."""

    code = "forbidden"


class OverLimit(TimewheelError):
    """Raised when a create would put a tenant over one of its limits; `field` names the
    limit, `retry_after_s` says when to retry (None: only a change of the tenant's own
    frees it, such as deleting a schedule)."""

    code = "over_limit"

    def __init__(self, message: str, *, retry_after_s: int | None, field: str | None = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.field = field


class StorageFull(TimewheelError):
    """Raised when a create would write to a Redis node using storage_guard_ratio of its
    ceiling (maxmemory, or storage_max_bytes if lower). Nothing was written; calls that
    finish or remove work (dispatch, ack, fail, cancel, delete, purge) are not refused."""

    code = "storage_full"

    def __init__(self, message: str, *, node: str, used_bytes: int, ceiling_bytes: int):
        super().__init__(message)
        self.node = node
        self.used_bytes = used_bytes
        self.ceiling_bytes = ceiling_bytes


# The SDK's errors (what a client of the HTTP API sees) live with the SDK; they are
# importable from here as well, as users write `from timewheel.errors import ConflictError`.
from timewheel.sdk.errors import (  # noqa: E402
    ApiError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitedError,
    ServerError,
    StorageFullError,
    TransportError,
    UnprocessableError,
)

__all__ = [
    "ApiError",
    "AuthenticationError",
    "BadRequestError",
    "ConfigError",
    "Conflict",
    "ConflictError",
    "Forbidden",
    "InvalidSchedule",
    "InvalidState",
    "LeaseLost",
    "NotFound",
    "NotFoundError",
    "OverLimit",
    "PayloadTooLarge",
    "PayloadTooLargeError",
    "PermanentError",
    "PermissionDeniedError",
    "PostgresUnavailable",
    "RateLimitedError",
    "RedisUnavailable",
    "ReplicasBehind",
    "RestoreRefused",
    "ScriptError",
    "ServerError",
    "StorageFull",
    "StorageFullError",
    "TaskNotFound",
    "TimewheelError",
    "TransportError",
    "Unauthorized",
    "UnprocessableError",
    "ValidationError",
]
