"""Request bodies of the HTTP API: parsed and validated into engine values, or ValidationError."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from timewheel.engine import NewTask, validate_name
from timewheel.errors import ValidationError
from timewheel.models import JSONValue

MAX_DELAY_S = 10 * 365 * 86400
MIN_RUN_AT_MS = 946_684_800_000  # 2000-01-01
MAX_RUN_AT_MS = 4_102_444_800_000  # 2100-01-01
JITTERS = ("full", "proportional", "none")
CREATE_FIELDS = {
    "queue",
    "run_at",
    "delay",
    "payload",
    "idempotency_key",
    "retry",
    "visibility_timeout_s",
    "expires_at",
    "window_s",
}
RETRY_FIELDS = {"max_attempts", "initial_s", "factor", "max_s", "jitter"}
PATCH_FIELDS = {"run_at", "delay", "payload"}


def parse_json_object(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a ValidationError with code malformed_json."""
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValidationError(f"body is not valid JSON: {exc}", code="malformed_json") from None
    if not isinstance(value, dict):
        raise ValidationError("body must be a JSON object", code="malformed_json")
    return value


def parse_time_ms(value: object, field: str) -> int:
    """An RFC 3339 timestamp with an offset, as epoch ms."""
    if not isinstance(value, str):
        raise ValidationError(f"{field} must be an RFC 3339 string", field=field)
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValidationError(
            f"{field} {value!r} is not RFC 3339 (e.g. 2026-11-29T17:00:00Z)", field=field
        ) from None
    if parsed.tzinfo is None or "T" not in value.upper():
        raise ValidationError(
            f"{field} {value!r} needs a date, a time and an offset (e.g. 2026-11-29T17:00:00Z)",
            field=field,
        )
    ms = round(parsed.timestamp() * 1000)
    if not MIN_RUN_AT_MS <= ms <= MAX_RUN_AT_MS:
        raise ValidationError(f"{field} {value!r} is outside 2000..2100", field=field)
    return ms


def _number(value: object, field: str, *, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValidationError(f"{field} must be a number", field=field)
    if not low <= value <= high:
        raise ValidationError(f"{field} must be between {low:g} and {high:g}", field=field)
    return float(value)


def _unknown(body: dict[str, Any], allowed: set[str], prefix: str = "") -> None:
    for name in body:
        if name not in allowed:
            raise ValidationError(f"unknown field {prefix}{name!r}", field=f"{prefix}{name}")


def _when(body: dict[str, Any], *, required: bool) -> tuple[int | None, int | None]:
    has_at, has_delay = "run_at" in body, "delay" in body
    if has_at and has_delay:
        raise ValidationError("give run_at or delay, not both", field="delay")
    if has_at:
        return parse_time_ms(body["run_at"], "run_at"), None
    if has_delay:
        delay_s = _number(body["delay"], "delay", low=0, high=MAX_DELAY_S)
        return None, round(delay_s * 1000)
    if required:
        raise ValidationError("run_at (RFC 3339) or delay (seconds) is required", field="run_at")
    return None, None


def _payload_json(value: JSONValue) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _retry(value: object) -> dict[str, JSONValue]:
    if not isinstance(value, dict):
        raise ValidationError("retry must be an object", field="retry")
    _unknown(value, RETRY_FIELDS, "retry.")
    out: dict[str, JSONValue] = {}
    if "max_attempts" in value:
        attempts = value["max_attempts"]
        if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= 1000:
            raise ValidationError(
                "retry.max_attempts must be an integer 1..1000", field="retry.max_attempts"
            )
        out["max_attempts"] = attempts
    for name, low, high in (
        ("initial_s", 0.001, 86400.0),
        ("factor", 1.0, 100.0),
        ("max_s", 0.001, 30 * 86400.0),
    ):
        if name in value:
            out[name] = _number(value[name], f"retry.{name}", low=low, high=high)
    if "jitter" in value:
        if value["jitter"] not in JITTERS:
            raise ValidationError(
                f"retry.jitter must be one of {', '.join(JITTERS)}", field="retry.jitter"
            )
        out["jitter"] = value["jitter"]
    return out


def _options(body: dict[str, Any]) -> dict[str, JSONValue]:
    opts: dict[str, JSONValue] = {}
    if "retry" in body:
        opts["retry"] = _retry(body["retry"])
    if "visibility_timeout_s" in body:
        opts["visibility_timeout_s"] = _number(
            body["visibility_timeout_s"], "visibility_timeout_s", low=0.1, high=86400 * 7
        )
    if "expires_at" in body:
        opts["expires_at_ms"] = parse_time_ms(body["expires_at"], "expires_at")
    if "window_s" in body:
        opts["window_s"] = _number(body["window_s"], "window_s", low=0, high=86400)
    return opts


def parse_create(
    body: dict[str, Any], tenant: str, *, default_queue: str, idempotency_header: str | None
) -> NewTask:
    """A create request body (DESIGN.md section 11) as a NewTask."""
    _unknown(body, CREATE_FIELDS)
    run_at_ms, delay_ms = _when(body, required=True)
    key = body.get("idempotency_key", idempotency_header)
    if key is not None and (not isinstance(key, str) or not 1 <= len(key) <= 255):
        raise ValidationError(
            "idempotency_key must be a string of 1-255 characters", field="idempotency_key"
        )
    return NewTask(
        tenant=tenant,
        queue=validate_name(body.get("queue", default_queue), "queue"),
        payload_json=_payload_json(body.get("payload")),
        run_at_ms=run_at_ms,
        delay_ms=delay_ms,
        idempotency_key=key,
        options=_options(body),
    )


MAX_BATCH = 1000


def parse_batch(body: dict[str, Any]) -> list[Any]:
    """The items of a batch create: {"tasks": [create body, ...]} with 1..MAX_BATCH items."""
    _unknown(body, {"tasks"})
    tasks = body.get("tasks")
    if not isinstance(tasks, list) or not 1 <= len(tasks) <= MAX_BATCH:
        raise ValidationError(f"tasks must be a list of 1..{MAX_BATCH} task objects", field="tasks")
    return tasks


def parse_page(query: Mapping[str, str]) -> tuple[int, str | None]:
    """(limit, cursor) of a list request: limit 1..1000 (default 100)."""
    raw = query.get("limit", "100")
    if not raw.isdigit() or not 1 <= int(raw) <= 1000:
        raise ValidationError("limit must be an integer 1..1000", field="limit")
    cursor = query.get("cursor") or None
    if cursor is not None and not re.fullmatch(r"\d{1,4}-\d{1,20}-\d{1,20}", cursor):
        raise ValidationError("cursor is not one this API gave out", field="cursor")
    return int(raw), cursor


def parse_patch(body: dict[str, Any]) -> tuple[int | None, int | None, str | None]:
    """A PATCH body: (run_at_ms, delay_ms, payload_json), each None when unchanged."""
    _unknown(body, PATCH_FIELDS)
    if not body:
        raise ValidationError("nothing to change: give run_at, delay or payload", field="run_at")
    run_at_ms, delay_ms = _when(body, required=False)
    payload = _payload_json(body["payload"]) if "payload" in body else None
    return run_at_ms, delay_ms, payload
