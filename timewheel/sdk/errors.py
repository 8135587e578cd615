"""What the SDK raises: the server answered with an error status, or could not be reached.

    TimewheelError
    ├── ApiError                  the server answered 4xx/5xx
    │   ├── BadRequestError       400 malformed JSON
    │   ├── AuthenticationError   401
    │   ├── PermissionDeniedError 403
    │   ├── NotFoundError         404
    │   ├── ConflictError         409
    │   ├── PayloadTooLargeError  413
    │   ├── UnprocessableError    422 a field is invalid (`field` names it)
    │   ├── RateLimitedError      429 (`retry_after_s`)
    │   └── ServerError           5xx
    │       └── StorageFullError  507 Redis is near its memory ceiling: creates refused
    └── TransportError            the server could not be reached (after the SDK's retries)

They are importable from timewheel.errors too.
"""

from __future__ import annotations

from timewheel.errors import TimewheelError


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
        self,
        status: int,
        code: str,
        message: str,
        field: str | None = None,
        retry_after_s: float | None = None,
    ):
        super().__init__(status, code, message, field)
        self.retry_after_s = retry_after_s


class ServerError(ApiError):
    """5xx: the server failed (or Redis is unavailable: 503)."""


class StorageFullError(ServerError):
    """507 storage_full: the deployment's Redis is near its memory ceiling, so creates are
    refused and nothing was written; reads, cancels and deletes still work. It clears as
    work finishes or an operator frees memory; retrying at once will not help."""


class TransportError(TimewheelError):
    """Raised by the SDK when the server cannot be reached (after retrying idempotent calls)."""
