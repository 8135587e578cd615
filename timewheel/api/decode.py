"""Requests decoded with their declarations (api/fields.py), and msgspec's errors turned
into the API's: ValidationError with code `malformed_json` (400) for a body that is not
one JSON object, code `invalid` (422) for a field, named by its dotted path
(`retry.max_attempts`).

Bodies are decoded by msgspec's JSON decoder, strict: no NaN or Infinity, no number
past a float's range, no type coercion (`"5"` is not a number, `true` not an integer).
Query strings are converted from their text: an integer parameter is ASCII digits only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from typing import Any, Generic, TypeVar

import msgspec
import msgspec.inspect as mi

from timewheel.api.fields import PRINTABLE
from timewheel.errors import ValidationError

S = TypeVar("S", bound=msgspec.Struct)

_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")
_QUOTED = re.compile(r"`([^`]*)`")
_DIGITS = re.compile(r"[0-9]{1,18}")
_OUT_OF_RANGE = ("Number out of range", "Integer value out of range")
"""What msgspec says of a number past a float's range or an integer of more than 4,300
digits (Python's limit on converting text to int)."""


class BodyDecoder(Generic[S]):
    """Decodes and checks request bodies of one declaration."""

    def __init__(self, kind: type[S]):
        self.kind = kind
        self._decoder = msgspec.json.Decoder(kind)

    def decode(self, body: bytes, *, root: str | None = None) -> S:
        """The body as a `kind`. `root` names the body in errors about the whole of it
        (an item of a batch); a request body that is not an object is malformed_json."""
        try:
            return self._decoder.decode(body)
        except msgspec.ValidationError as exc:
            # The decoder stops at the first bad field; a body that is not JSON further on
            # (a NaN after it) is still malformed, whatever came before.
            _syntax(body)
            raise invalid(self.kind, str(exc), root) from None
        except (msgspec.DecodeError, RecursionError) as exc:
            raise _malformed(exc) from None


_RAW = msgspec.json.Decoder(msgspec.Raw)


def _syntax(body: bytes) -> None:
    """Raise malformed_json unless the body is JSON text (checked, not built)."""
    try:
        _RAW.decode(body)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise _malformed(exc) from None


def _malformed(exc: Exception) -> ValidationError:
    reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
    return ValidationError(f"body is not valid JSON: {reason}", code="malformed_json")


class QueryDecoder(Generic[S]):
    """Converts query strings of one declaration; empty parameters count as absent."""

    def __init__(self, kind: type[S]):
        self.kind = kind
        info = mi.type_info(kind)
        assert isinstance(info, mi.StructType)
        self._fields = [(f.encode_name, f.type) for f in info.fields]

    def decode(self, params: Mapping[str, str]) -> S:
        data: dict[str, object] = {}
        for name, t in self._fields:
            raw = params.get(name)
            if not raw:
                continue
            if _is_int(t):
                if not _DIGITS.fullmatch(raw):
                    raise ValidationError(_must(name, t), field=name)
                data[name] = int(raw)
            else:
                data[name] = raw
        try:
            return msgspec.convert(data, self.kind)
        except msgspec.ValidationError as exc:
            raise invalid(self.kind, str(exc), None) from None


def convert(value: object, kind: Any, name: str) -> Any:
    """`value` (a header, a path segment) checked against a field type; errors name `name`."""
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError:
        raise ValidationError(_must(name, mi.type_info(kind)), field=name) from None


def _is_int(t: mi.Type) -> bool:
    if isinstance(t, mi.Metadata):
        return _is_int(t.type)
    if isinstance(t, mi.UnionType):
        return any(_is_int(member) for member in t.types)
    return isinstance(t, mi.IntType)


# -- msgspec's error text -> the API's error ------------------------------------------


def invalid(kind: type[msgspec.Struct], text: str, root: str | None) -> ValidationError:
    """The API's error for msgspec's error `text` about a `kind` body."""
    match = _AT.match(text)
    assert match is not None
    what, path = match["what"], match["path"] or ""
    steps = [name or index for name, index in _STEP.findall(path)]
    t: mi.Type = _info(kind)
    names: list[str] = []
    for step in steps:
        inner = _step(t, step)
        if inner is None:  # inside free-form JSON (the payload): the field is its holder
            break
        names.append(step)
        t = inner
    quoted = _QUOTED.findall(what)
    if what.startswith("Object contains unknown field") and len(names) == len(steps):
        dotted = ".".join([*names, quoted[0]])
        return ValidationError(f"unknown field {dotted!r}", field=dotted)
    if what.startswith("Object missing required field") and len(names) == len(steps):
        dotted = ".".join([*names, quoted[0]])
        return ValidationError(f"{dotted} is required", field=dotted)
    if not names:
        if root is None:
            return ValidationError("body must be a JSON object", code="malformed_json")
        return ValidationError(f"{root} must be a JSON object", field=root)
    dotted = ".".join(names)
    if what in _OUT_OF_RANGE and isinstance(_bare(t), mi.AnyType):
        return ValidationError(f"{dotted} holds a number out of range", field=dotted)
    return ValidationError(_must(dotted, t), field=dotted)


@cache
def _info(kind: type[msgspec.Struct]) -> mi.Type:
    return mi.type_info(kind)


def _bare(t: mi.Type) -> mi.Type:
    while isinstance(t, mi.Metadata):
        t = t.type
    return t


def _members(t: mi.Type) -> list[mi.Type]:
    """The types a field takes besides null, each with its own metadata."""
    bare = _bare(t)
    if isinstance(bare, mi.UnionType):
        return [m for m in bare.types if not isinstance(_bare(m), mi.NoneType)]
    return [t]


def _nullable(t: mi.Type) -> bool:
    bare = _bare(t)
    return isinstance(bare, mi.UnionType) and any(
        isinstance(_bare(m), mi.NoneType) for m in bare.types
    )


def _step(t: mi.Type, step: str) -> mi.Type | None:
    """The type one step (a field name or an index) inside `t`; None inside free JSON."""
    for member in map(_bare, _members(t)):
        if isinstance(member, mi.StructType):
            for f in member.fields:
                if f.encode_name == step:
                    return f.type
        elif isinstance(member, mi.ListType):
            return member.item_type
        elif isinstance(member, mi.DictType):
            return member.value_type
    return None


def _must(name: str, t: mi.Type) -> str:
    """'<name> must be <what the declaration takes>'."""
    for candidate in (t, *_members(t)):
        message = _extra(candidate).get("message")
        if isinstance(message, str):
            return message.format(name=name)
    return f"{name} must be {describe(t)}"


def _extra(t: mi.Type) -> dict[str, Any]:
    """The `extra` of a type's msgspec.Meta annotations (`message`, `says`)."""
    out: dict[str, Any] = {}
    while isinstance(t, mi.Metadata):
        out = {**(t.extra or {}), **out}
        t = t.type
    return out


def _number(value: float) -> str:
    """315360000 -> 315,360,000; 86400.0 -> 86,400; 0.001 -> 0.001."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{value:,}"


def _bounds(t: mi.IntType | mi.FloatType) -> str:
    low = t.ge if t.ge is not None else t.gt
    high = t.le if t.le is not None else t.lt
    if low is not None and high is not None:
        return f" from {_number(low)} to {_number(high)}"
    if low is not None:
        return f" of at least {_number(low)}"
    return f" of at most {_number(high)}" if high is not None else ""


def describe(t: mi.Type) -> str:
    """What a declared type takes, in words: 'an integer from 1 to 1000'."""
    words = [_one(_bare(m), _extra(m).get("says")) for m in _members(t)]
    if _nullable(t):
        words.append("null")
    return " or ".join(words)


def _one(t: mi.Type, says: object) -> str:
    if isinstance(t, mi.IntType):
        return "an integer" + _bounds(t)
    if isinstance(t, mi.FloatType):
        return "a number" + _bounds(t)
    if isinstance(t, mi.BoolType):
        return "true or false"
    if isinstance(t, mi.DateTimeType):
        return "an RFC 3339 time with an offset (e.g. 2026-11-29T17:00:00Z)"
    if isinstance(t, mi.LiteralType):
        return "one of " + ", ".join(str(v) for v in t.values)
    if isinstance(t, mi.StrType):
        return _text(t, says)
    if isinstance(t, mi.ListType):
        return f"a list of {t.min_length or 0}..{t.max_length} items"
    if isinstance(t, mi.StructType):
        return "a JSON object"
    return "JSON"


def _text(t: mi.StrType, says: object) -> str:
    out = "a string"
    if t.min_length is not None and t.max_length is not None:
        out += f" of {t.min_length}-{t.max_length} characters"
    if isinstance(says, str):
        out += f" {says}"
    elif t.pattern is not None and t.pattern != PRINTABLE:
        out += f" matching {t.pattern}"
    return out
