"""Every exception timewheel raises, in one tree.

    TimewheelError
    ├── ConfigError               settings or environment unusable (missing binary, bad URL)
    │   └── RestoreRefused        restore would write into a Redis that already holds data
    ├── PermanentError            raised by a handler: the run cannot succeed, dead-letter it
    ├── RedisUnavailable          Redis could not be reached or answered with a server error
    ├── Unauthorized              no API key, or one that is unknown or revoked (HTTP 401)
    ├── Forbidden                 the key's role does not allow the endpoint (HTTP 403)
    ├── NotFound                  no such tenant or key (HTTP 404)
    ├── Conflict                  the thing to create exists already (HTTP 409)
    ├── OverLimit                 the tenant is over one of its limits (HTTP 429)
    ├── ApiError                  the SDK: the server answered 4xx/5xx (timewheel.client)
    │   ├── BadRequestError       400 malformed JSON
    │   ├── AuthenticationError   401
    │   ├── PermissionDeniedError 403
    │   ├── NotFoundError         404
    │   ├── ConflictError         409
    │   ├── PayloadTooLargeError  413
    │   ├── UnprocessableError    422 a field is invalid (`field` names it)
    │   ├── RateLimitedError      429 (`retry_after_s`)
    │   └── ServerError           5xx
    ├── TransportError            the SDK could not reach the server (after its retries)
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


class Unauthorized(TimewheelError):
    """Raised when a request has no API key, or one that is unknown or revoked."""

    code = "unauthorized"


class Forbidden(TimewheelError):
    """Raised when the key is valid but its role may not use the endpoint (tenant vs admin)."""

    code = "forbidden"


class NotFound(TimewheelError):
    """Raised when a tenant or an API key id is unknown (tasks have TaskNotFound)."""

    code = "not_found"


class Conflict(TimewheelError):
    """Raised when creating something whose id exists already (a tenant)."""

    code = "conflict"


class OverLimit(TimewheelError):
    """Raised when a tenant is over one of its limits; `retry_after_s` says when to retry."""

    code = "over_limit"

    def __init__(self, message: str, *, retry_after_s: int, field: str | None = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.field = field


class ApiError(TimewheelError):
    """Raised by the SDK (timewheel.client) when the API answers with an error status."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None):
        super().__init__(f"{status} {code}: {message}" + (f" (field {field})" if field else ""))
        self.status = status
        self.code = code
        self.message = message
        self.field = field


class BadRequestError(ApiError):
    """400: the request body is not a JSON object."""


class AuthenticationError(ApiError):
    """401: no API key, or an unknown or revoked one."""


class PermissionDeniedError(ApiError):
    """403: the key may not use this endpoint (admin only)."""


class NotFoundError(ApiError):
    """404: unknown id, or another tenant's (never distinguished)."""


class ConflictError(ApiError):
    """409: the task is past the state the change needs, or the tenant exists."""


class PayloadTooLargeError(ApiError):
    """413: the payload is over the deployment's or the tenant's limit."""


class UnprocessableError(ApiError):
    """422: a field is invalid; `field` names it."""


class RateLimitedError(ApiError):
    """429: the tenant is over a limit; retry after `retry_after_s` seconds."""

    def __init__(
        self, status: int, code: str, message: str, field: str | None = None,
        retry_after_s: float | None = None,
    ):
        super().__init__(status, code, message, field)
        self.retry_after_s = retry_after_s


class ServerError(ApiError):
    """5xx: the server failed (or Redis is unavailable: 503)."""


class TransportError(TimewheelError):
    """Raised by the SDK when the server cannot be reached (after retrying idempotent calls)."""
