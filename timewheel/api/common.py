"""What every resource of the HTTP API shares: the retry policy, the page size, the
payload's JSON text, and the error, event and page shapes of the answers.

Request bodies and query strings are msgspec.Struct declarations (api/fields.py); the
answers are produced by the handlers, so their shapes are JSON Schema here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta
from starlette.responses import Response

from timewheel.api.fields import Maybe, Schema

Jitter = Literal["full", "proportional", "none"]


class RetryPolicy(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """retry policy; missing fields take the deployment's defaults"""

    max_attempts: Maybe[
        Annotated[int, Meta(ge=1, le=1000, description="attempts before the run is dead-lettered")]
    ] = UNSET
    initial_s: Maybe[
        Annotated[float, Meta(ge=0.001, le=86400, description="backoff before the second attempt")]
    ] = UNSET
    factor: Maybe[
        Annotated[float, Meta(ge=1, le=100, description="backoff multiplier per attempt")]
    ] = UNSET
    max_s: Maybe[
        Annotated[float, Meta(ge=0.001, le=30 * 86400, description="cap of one backoff")]
    ] = UNSET
    jitter: Maybe[Jitter] = UNSET


PageSize = Annotated[int, Meta(ge=1, le=1000, description="page size (default 100)")]
"""The `limit` of every listing."""

Cursor = Annotated[
    str,
    Meta(min_length=1, max_length=64, extra={"message": "cursor is not one this API gave out"}),
]
"""The `cursor` of a listing (each listing adds the pattern of its own cursors)."""

_encode = msgspec.json.Encoder().encode


def payload_json(value: Any) -> str:
    """A payload as the JSON text stored with the task (compact, UTF-8)."""
    return _encode(value).decode()


class JSONBytes(Response):
    """A JSON answer already encoded: the headers Starlette's JSONResponse sends
    (content-length, content-type: application/json), without its json.dumps and its
    header building."""

    media_type = "application/json"

    def __init__(self, body: bytes, status_code: int = 200):
        self.status_code = status_code
        self.body = body
        self.background = None
        self.raw_headers = [
            (b"content-length", b"%d" % len(body)),
            (b"content-type", b"application/json"),
        ]


def json_bytes(value: Any) -> bytes:
    """A value as compact UTF-8 JSON (msgspec; msgspec.Raw values are inserted as they are)."""
    return _encode(value)


def builtins(value: msgspec.Struct) -> dict[str, Any]:
    """A decoded object as plain JSON values, without the fields it was not given."""
    out: dict[str, Any] = msgspec.to_builtins(value)
    return out


# -- responses (documentation only: the handlers build them) --------------------------

ERROR: Schema = {
    "title": "Error",
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message", "field"],
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "field": {"type": ["string", "null"]},
            },
        }
    },
}

TIME: Schema = {"type": "string", "format": "date-time"}
OPT_TIME: Schema = {"type": ["string", "null"], "format": "date-time"}

EVENT: Schema = {
    "type": "object",
    "properties": {
        "event": {"type": "string"},
        "at": TIME,
        "attempt": {"type": ["integer", "null"]},
        "reason": {"type": ["string", "null"]},
        "error": {"type": ["string", "null"]},
    },
}
"""One event of a run's history (api/tasks.py, event_json)."""


def page_schema(title: str, item: Schema) -> Schema:
    """A page of a listing: its items and the cursor of the next page (null: the end)."""
    return {
        "title": title,
        "type": "object",
        "required": ["items", "next_cursor"],
        "properties": {
            "items": {"type": "array", "items": item},
            "next_cursor": {"type": ["string", "null"]},
        },
    }
