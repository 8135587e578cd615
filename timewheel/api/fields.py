"""What the request declarations of the HTTP API are made of: field types with their
constraints, the `Body` base of every request body, and the cross-field rules.

Every request body and every query string is one msgspec.Struct, declared in its
resource's schema module (api/task_schemas.py, api/schedule_schemas.py, api/tenants.py,
api/dead_letters.py, api/common.py). That one class is what the request is decoded and
checked with (api/decode.py), what /openapi.json documents (api/openapi.py, through
msgspec.json.schema_components) and what the fuzz tests generate requests from. A field
is one annotated attribute: its type, its bounds (msgspec.Meta: ge, le, min_length,
max_length, pattern) and its description. A field left out of a body is `UNSET`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Annotated, Any, ClassVar, Protocol, TypeAlias, TypeVar

import msgspec
import msgspec.inspect as mi
from msgspec import UNSET, Meta, UnsetType

from timewheel.errors import ValidationError

Schema = dict[str, Any]
T = TypeVar("T")

Maybe: TypeAlias = T | UnsetType
"""A field a body may leave out: then it is UNSET (null is a value, not an absence)."""

MIN_TIME_MS = 946_684_800_000  # 2000-01-01
MAX_TIME_MS = 4_102_444_800_000  # 2100-01-01

END = r"$(?!\n)"
"""The end of the text. Python's `$` also matches before a final newline (msgspec checks
a pattern with re.search); the lookahead refuses that one, and means nothing more in
the ECMAScript patterns of JSON Schema."""

PRINTABLE = r"^[^\x00-\x1f\x7f]*" + END
"""A string without control characters (U+0000-U+001F, U+007F)."""

Text = Annotated[str, Meta(pattern=PRINTABLE, extra={"says": "without control characters"})]
"""Free text of a field that is not the payload: never a control character."""

Name = Annotated[
    str,
    Meta(
        min_length=1,
        max_length=64,
        pattern="^[A-Za-z0-9_.-]+" + END,
        extra={"message": "{name} must be 1-64 characters of A-Z a-z 0-9 _ . -"},
    ),
]
"""A tenant or queue name (they go into Redis keys)."""

Time = Annotated[datetime, Meta(tz=True)]
"""An RFC 3339 time with an offset; a body refuses one outside 2000..2100 (Body)."""

IdempotencyKey = Annotated[Text, Meta(min_length=1, max_length=255)]


def ms(value: datetime) -> int:
    """A time of a body as epoch milliseconds."""
    return round(value.timestamp() * 1000)


def given(body: msgspec.Struct, name: str) -> bool:
    """Whether the body has the field (by attribute name)."""
    return getattr(body, name) is not UNSET


class Rule(Protocol):
    """A cross-field rule of a body: checked after its fields, and documented."""

    def check(self, body: Body) -> None: ...

    def schema(self) -> Schema: ...


class Body(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A request body: a JSON object of known fields (any other one is refused)."""

    rules: ClassVar[tuple[Rule, ...]] = ()

    def __post_init__(self) -> None:
        for name, field in _times(type(self)):
            value = getattr(self, name)
            if isinstance(value, datetime) and not MIN_TIME_MS <= ms(value) <= MAX_TIME_MS:
                raise ValidationError(
                    f"{field} {value.isoformat()} is outside 2000..2100", field=field
                )
        for rule in self.rules:
            rule.check(self)


class Query(msgspec.Struct, kw_only=True):
    """A query string: its parameters (unknown ones are ignored, as is usual)."""


@cache
def _times(cls: type[msgspec.Struct]) -> tuple[tuple[str, str], ...]:
    """(attribute, field name) of the cls's time fields."""
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    return tuple((f.name, f.encode_name) for f in info.fields if _is_time(f.type))


def _is_time(t: mi.Type) -> bool:
    if isinstance(t, mi.Metadata):
        return _is_time(t.type)
    if isinstance(t, mi.UnionType):
        return any(_is_time(member) for member in t.types)
    return isinstance(t, mi.DateTimeType)


def _name(body: Body, attribute: str) -> str:
    return _encode_names(type(body)).get(attribute, attribute)


@cache
def _encode_names(cls: type[msgspec.Struct]) -> dict[str, str]:
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    return {f.name: f.encode_name for f in info.fields}


@dataclass(frozen=True)
class NotBoth:
    """At most one of two fields."""

    first: str
    second: str

    def check(self, body: Body) -> None:
        if given(body, self.first) and given(body, self.second):
            first, second = _name(body, self.first), _name(body, self.second)
            raise ValidationError(f"give {first} or {second}, not both", field=second)

    def schema(self) -> Schema:
        return {"not": {"required": [self.first, self.second]}}


@dataclass(frozen=True)
class Either:
    """At least one of two fields."""

    first: str
    second: str
    message: str

    def check(self, body: Body) -> None:
        if not given(body, self.first) and not given(body, self.second):
            raise ValidationError(self.message, field=_name(body, self.first))

    def schema(self) -> Schema:
        return {"anyOf": [{"required": [self.first]}, {"required": [self.second]}]}


@dataclass(frozen=True)
class NotEmpty:
    """At least one field (a PATCH that changes something)."""

    message: str
    field: str

    def check(self, body: Body) -> None:
        if not any(given(body, name) for name in body.__struct_fields__):
            raise ValidationError(self.message, field=self.field)

    def schema(self) -> Schema:
        return {"minProperties": 1}


@dataclass(frozen=True)
class NotBefore:
    """A time field that may not be before another one (both given)."""

    later: str
    earlier: str

    def check(self, body: Body) -> None:
        late, early = getattr(body, self.later), getattr(body, self.earlier)
        if isinstance(late, datetime) and isinstance(early, datetime) and late < early:
            later, earlier = _name(body, self.later), _name(body, self.earlier)
            raise ValidationError(f"{later} is before {earlier}", field=later)

    def schema(self) -> Schema:
        return {}
