"""What every resource of the HTTP API shares: the JSON body parser, the retry policy,
times, events, error and page shapes.

Each resource module (api/tasks.py, schedules, dead_letters, tenants, ops) declares its
bodies and query strings as field specs (timewheel/api/spec.py): the handlers parse
with them and the OpenAPI document is generated from the same objects. Response shapes
are JSON Schema (they are produced, not parsed).
"""

from __future__ import annotations

import json
from typing import Any

from timewheel.api.spec import (
    Integer,
    IntText,
    Number,
    Obj,
    OneOf,
    Param,
    Schema,
)
from timewheel.errors import ValidationError
from timewheel.types import JSONValue

JITTERS = ("full", "proportional", "none")


def parse_json_object(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a ValidationError with code malformed_json."""
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ValidationError(f"body is not valid JSON: {exc}", code="malformed_json") from None
    if not isinstance(value, dict):
        raise ValidationError("body must be a JSON object", code="malformed_json")
    return value


RETRY = Obj(
    {
        "max_attempts": Integer(1, 1000, "attempts before the run is dead-lettered"),
        "initial_s": Number(0.001, 86400.0, "backoff before the second attempt"),
        "factor": Number(1.0, 100.0, "backoff multiplier per attempt"),
        "max_s": Number(0.001, 30 * 86400.0, "cap of one backoff"),
        "jitter": OneOf(JITTERS),
    },
    title="RetryPolicy",
    description="retry policy; missing fields take the deployment's defaults",
)

PAGE_SIZE = Param(IntText(1, 1000, "page size (default 100)"), "100")
"""The `limit` of every listing."""


def payload_json(value: JSONValue) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


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
