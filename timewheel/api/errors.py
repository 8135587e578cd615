"""The one place exceptions become HTTP responses: {"error": {"code", "message", "field"}}."""

from __future__ import annotations

import structlog
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from timewheel.errors import (
    InvalidState,
    PayloadTooLarge,
    RedisUnavailable,
    TaskNotFound,
    TimewheelError,
    ValidationError,
)

log = structlog.get_logger("timewheel.api")


def error_response(status: int, code: str, message: str, field: str | None = None) -> JSONResponse:
    return JSONResponse(
        {"error": {"code": code, "message": message, "field": field}}, status_code=status
    )


def status_of(exc: TimewheelError) -> int:
    """The HTTP status of an error of ours."""
    if isinstance(exc, PayloadTooLarge):
        return 413
    if isinstance(exc, ValidationError):
        return 400 if exc.code == "malformed_json" else 422
    if isinstance(exc, TaskNotFound):
        return 404
    if isinstance(exc, InvalidState):
        return 409
    if isinstance(exc, RedisUnavailable):
        return 503
    return 500


def error_body(exc: TimewheelError) -> dict[str, str | None]:
    """The {"code", "message", "field"} of an error of ours."""
    code = "unavailable" if isinstance(exc, RedisUnavailable) else getattr(exc, "code", "error")
    return {"code": code, "message": str(exc), "field": getattr(exc, "field", None)}


async def timewheel_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, TimewheelError)
    status = status_of(exc)
    if status >= 500:
        log.warning("request_failed", path=request.url.path, error=str(exc))
    return JSONResponse({"error": error_body(exc)}, status_code=status)


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    codes = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}
    return error_response(exc.status_code, codes.get(exc.status_code, "http_error"), exc.detail)


async def unexpected_error(request: Request, exc: Exception) -> Response:
    log.exception("unhandled_error", path=request.url.path)
    return error_response(500, "internal", "internal error; see the server log")


HANDLERS = {
    TimewheelError: timewheel_error,
    HTTPException: http_error,
    Exception: unexpected_error,
}
