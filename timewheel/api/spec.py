"""Declarative field specs: each one validates a JSON value and emits its JSON Schema.

Request bodies and query strings are described once with these, in each resource module
of timewheel/api/; the handlers parse with them and timewheel/api/openapi.py documents
them, so the OpenAPI document cannot drift from what is enforced. Errors are
ValidationError with the field's dotted name, e.g. ``retry.max_attempts``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from timewheel.errors import ValidationError

Schema = dict[str, Any]
MIN_TIME_MS = 946_684_800_000  # 2000-01-01
MAX_TIME_MS = 4_102_444_800_000  # 2100-01-01


class Spec:
    """A field: `parse(value, name)` returns the value to use or raises ValidationError."""

    description: str = ""

    def parse(self, value: object, name: str) -> Any:
        raise NotImplementedError

    def schema(self) -> Schema:
        raise NotImplementedError

    def documented(self) -> Schema:
        out = self.schema()
        if self.description:
            out["description"] = self.description
        return out


@dataclass
class Number(Spec):
    """A finite number in [low, high] (booleans refused)."""

    low: float
    high: float
    description: str = ""

    def parse(self, value: object, name: str) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise ValidationError(f"{name} must be a number", field=name)
        if not self.low <= value <= self.high:
            raise ValidationError(
                f"{name} must be between {self.low:g} and {self.high:g}", field=name
            )
        return float(value)

    def schema(self) -> Schema:
        return {"type": "number", "minimum": self.low, "maximum": self.high}


@dataclass
class Integer(Spec):
    """An integer in [low, high]."""

    low: int
    high: int
    description: str = ""

    def parse(self, value: object, name: str) -> int:
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not self.low <= value <= self.high
        ):
            raise ValidationError(f"{name} must be an integer {self.low}..{self.high}", field=name)
        return value

    def schema(self) -> Schema:
        return {"type": "integer", "minimum": self.low, "maximum": self.high}


@dataclass
class Text(Spec):
    """A string of min_len..max_len characters, optionally matching `pattern`."""

    min_len: int = 1
    max_len: int = 255
    pattern: str | None = None
    message: str = "{name} must be a string of {min_len}-{max_len} characters"
    description: str = ""

    def parse(self, value: object, name: str) -> str:
        if (
            not isinstance(value, str)
            or not self.min_len <= len(value) <= self.max_len
            or (self.pattern is not None and not re.fullmatch(self.pattern, value))
        ):
            raise ValidationError(
                self.message.format(
                    name=name, min_len=self.min_len, max_len=self.max_len, value=value
                ),
                field=name,
            )
        return value

    def schema(self) -> Schema:
        out: Schema = {"type": "string", "minLength": self.min_len, "maxLength": self.max_len}
        if self.pattern is not None:
            out["pattern"] = f"^{self.pattern}$"
        return out


NAME_PATTERN = r"[A-Za-z0-9_.-]{1,64}"


def name_spec(description: str = "") -> Text:
    """A tenant or queue name (they go into Redis keys)."""
    return Text(
        1,
        64,
        NAME_PATTERN,
        "{name} must be 1-64 characters of A-Z a-z 0-9 _ . - (got {value!r})",
        description,
    )


@dataclass
class OneOf(Spec):
    """One of a fixed set of strings."""

    values: tuple[str, ...]
    description: str = ""

    def parse(self, value: object, name: str) -> str:
        if value not in self.values:
            raise ValidationError(f"{name} must be one of {', '.join(self.values)}", field=name)
        assert isinstance(value, str)
        return value

    def schema(self) -> Schema:
        return {"type": "string", "enum": list(self.values)}


@dataclass
class Time(Spec):
    """An RFC 3339 timestamp with an offset, between 2000 and 2100; parsed to epoch ms."""

    description: str = ""

    def parse(self, value: object, name: str) -> int:
        if not isinstance(value, str):
            raise ValidationError(f"{name} must be an RFC 3339 string", field=name)
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise ValidationError(
                f"{name} {value!r} is not RFC 3339 (e.g. 2026-11-29T17:00:00Z)", field=name
            ) from None
        if parsed.tzinfo is None or "T" not in value.upper():
            raise ValidationError(
                f"{name} {value!r} needs a date, a time and an offset (e.g. 2026-11-29T17:00:00Z)",
                field=name,
            )
        try:
            ms = round(parsed.timestamp() * 1000)
        except (OverflowError, ValueError):
            ms = -1
        if not MIN_TIME_MS <= ms <= MAX_TIME_MS:
            raise ValidationError(f"{name} {value!r} is outside 2000..2100", field=name)
        return ms

    def schema(self) -> Schema:
        return {"type": "string", "format": "date-time"}


@dataclass
class Nullable(Spec):
    """`inner`, or null (a PATCH removing a bound, or clearing a setting to its default)."""

    inner: Spec

    def parse(self, value: object, name: str) -> Any:
        return None if value is None else self.inner.parse(value, name)

    def schema(self) -> Schema:
        return self.documented()

    def documented(self) -> Schema:
        out = self.inner.documented()
        out["type"] = [out["type"], "null"]
        return out


@dataclass
class Bool(Spec):
    """true or false."""

    description: str = ""

    def parse(self, value: object, name: str) -> bool:
        if not isinstance(value, bool):
            raise ValidationError(f"{name} must be true or false", field=name)
        return value

    def schema(self) -> Schema:
        return {"type": "boolean"}


@dataclass
class AnyJSON(Spec):
    """Any JSON value, kept as is."""

    description: str = ""

    def parse(self, value: object, name: str) -> object:
        return value

    def schema(self) -> Schema:
        return {}


@dataclass
class Array(Spec):
    """A list of min_items..max_items; items are checked by the caller (per-item results)."""

    items: Spec
    min_items: int
    max_items: int
    message: str
    description: str = ""

    def parse(self, value: object, name: str) -> list[Any]:
        if not isinstance(value, list) or not self.min_items <= len(value) <= self.max_items:
            raise ValidationError(self.message, field=name)
        return value

    def schema(self) -> Schema:
        return {
            "type": "array",
            "items": self.items.documented(),
            "minItems": self.min_items,
            "maxItems": self.max_items,
        }


Check = Callable[[dict[str, Any], dict[str, Any]], None]
"""A cross-field rule: (raw object, parsed values) -> None or ValidationError."""


@dataclass
class Obj(Spec):
    """A JSON object with known fields (others refused). Parsed into {name: value}."""

    fields: Mapping[str, Spec]
    required: Sequence[str] = ()
    checks: Sequence[Check] = ()
    extra_schema: Schema = field(default_factory=dict)
    message: str = "{name} must be an object"
    title: str | None = None
    description: str = ""

    def parse(self, value: object, name: str = "") -> dict[str, Any]:
        if not isinstance(value, dict):
            raise ValidationError(self.message.format(name=name), field=name or None)
        prefix = f"{name}." if name else ""
        for key in value:
            if key not in self.fields:
                raise ValidationError(f"unknown field {prefix}{key!r}", field=f"{prefix}{key}")
        for key in self.required:
            if key not in value:
                raise ValidationError(f"{prefix}{key} is required", field=f"{prefix}{key}")
        out = {
            key: spec.parse(value[key], prefix + key)
            for key, spec in self.fields.items()
            if key in value
        }
        for check in self.checks:
            check(value, out)
        return out

    def schema(self) -> Schema:
        out: Schema = {
            "type": "object",
            "properties": {k: s.documented() for k, s in self.fields.items()},
            "additionalProperties": False,
        }
        if self.required:
            out["required"] = list(self.required)
        if self.title:
            out["title"] = self.title
        out.update(self.extra_schema)
        return out


@dataclass
class Param:
    """A query parameter: its spec takes the string as sent; `default` when absent."""

    spec: Spec
    default: str | None = None


@dataclass
class Query:
    """The query parameters of an endpoint (unknown ones are ignored, as is usual)."""

    params: Mapping[str, Param]

    def parse(self, query: Mapping[str, str]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, param in self.params.items():
            raw = query.get(key) or param.default
            out[key] = None if raw is None else param.spec.parse(raw, key)
        return out


@dataclass
class IntText(Spec):
    """An integer sent as text (a query parameter), in [low, high]."""

    low: int
    high: int
    description: str = ""

    def parse(self, value: object, name: str) -> int:
        if (
            not isinstance(value, str)
            or not value.isdigit()
            or len(value) > 12
            or not self.low <= int(value) <= self.high
        ):
            raise ValidationError(f"{name} must be an integer {self.low}..{self.high}", field=name)
        return int(value)

    def schema(self) -> Schema:
        return {"type": "integer", "minimum": self.low, "maximum": self.high}
