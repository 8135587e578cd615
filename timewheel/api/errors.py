"""The one place exceptions become HTTP responses: {"error": {"code", "message", "field"}}."""

from __future__ import annotations

import structlog
from redis.exceptions import ConnectionError, RedisClusterException, TimeoutError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from timewheel.errors import (
    Conflict,
    Forbidden,
    NotFound,
    OverLimit,
    PayloadTooLarge,
    PostgresUnavailable,
    RedisUnavailable,
    StorageFull,
    TimewheelError,
    Unauthorized,
    ValidationError,
)

log = structlog.get_logger("timewheel.api")

OUTAGE = (ConnectionError, TimeoutError, OSError, RedisClusterException)
"""Redis out of reach, where a handler did not say so itself: a 503 like RedisUnavailable
(redis-py's Cluster client raises RedisClusterException, which is no RedisError, once no
node answers)."""

STATUS: tuple[tuple[type[TimewheelError], int], ...] = (
    (PayloadTooLarge, 413),
    (Unauthorized, 401),
    (Forbidden, 403),
    (NotFound, 404),
    (Conflict, 409),
    (OverLimit, 429),
    (StorageFull, 507),
    (RedisUnavailable, 503),
    (PostgresUnavailable, 503),
)
"""Exception class -> HTTP status; ValidationError is 400 (malformed_json) or 422."""


def error_response(
    status: int,
    code: str,
    message: str,
    field: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(
        {"error": {"code": code, "message": message, "field": field}},
        status_code=status,
        headers=headers,
    )


def status_of(exc: TimewheelError) -> int:
    """The HTTP status of an error of ours."""
    for cls, status in STATUS:
        if isinstance(exc, cls):
            return status
    if isinstance(exc, ValidationError):
        return 400 if exc.code == "malformed_json" else 422
    return 500


def error_body(exc: TimewheelError) -> dict[str, str | None]:
    """The {"code", "message", "field"} of an error of ours."""
    unavailable = isinstance(exc, RedisUnavailable | PostgresUnavailable)
    code = "unavailable" if unavailable else getattr(exc, "code", "error")
    return {"code": code, "message": str(exc), "field": getattr(exc, "field", None)}


def response_for(request: Request, exc: Exception) -> Response:
    """The response for any exception a handler raised."""
    if isinstance(exc, TimewheelError):
        status = status_of(exc)
        if status >= 500 and not isinstance(exc, StorageFull):  # the guard logs its own
            log.warning("request_failed", path=request.url.path, error=str(exc))
        headers = None
        if isinstance(exc, OverLimit) and exc.retry_after_s is not None:
            headers = {"Retry-After": str(exc.retry_after_s)}
        return JSONResponse({"error": error_body(exc)}, status_code=status, headers=headers)
    if isinstance(exc, OUTAGE):
        return response_for(request, RedisUnavailable(f"Redis is out of reach: {exc}"))
    if isinstance(exc, HTTPException):
        codes = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}
        return error_response(exc.status_code, codes.get(exc.status_code, "http_error"), exc.detail)
    log.exception("unhandled_error", path=request.url.path)
    return error_response(500, "internal", "internal error; see the server log")


async def handle(request: Request, exc: Exception) -> Response:
    return response_for(request, exc)


HANDLERS = {HTTPException: handle, Exception: handle}
