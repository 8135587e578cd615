"""Request bodies and query strings decoded with their declarations (api/fields.py,
api/decode.py), without a server: every bad input is a ValidationError naming its field in
words a client can read, and the OpenAPI document is the declarations' own schema."""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from timewheel.api.app import ENDPOINTS
from timewheel.api.decode import BodyDecoder, QueryDecoder
from timewheel.api.openapi import document, request_schemas
from timewheel.api.task_schemas import TaskCreate, TaskQuery
from timewheel.errors import ValidationError

BODIES = sorted({e.body for e in ENDPOINTS if e.body is not None}, key=lambda t: t.__name__)
QUERIES = sorted({e.query for e in ENDPOINTS if e.query is not None}, key=lambda t: t.__name__)
INTERNAL = re.compile(r"msgspec|Struct|Unset|Error|Traceback|`|\$\.|\bstr\b|\bint\b|\bfloat\b")
"""What no message may say: the decoder's own names and Python's type names."""


def _error(kind: type[msgspec.Struct], body: bytes) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        BodyDecoder(kind).decode(body)
    assert not INTERNAL.search(str(caught.value)), str(caught.value)
    return caught.value


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        (b'{"delay": NaN}', "malformed_json", None),
        (b'{"priority": 1, "delay": NaN}', "malformed_json", None),  # after a bad field too
        (b'{"delay": "x", "payload": [Infinity]}', "malformed_json", None),
        (b'{"delay": 1, "payload": -Infinity}', "malformed_json", None),
        (b"[1]", "malformed_json", None),
        (b"\xff", "malformed_json", None),
        (b"[" * 10_000 + b"]" * 10_000, "malformed_json", None),
        (
            b'{"delay": 1, "payload": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
            "malformed_json",
            None,
        ),
        (b'{"delay": 1' + b"0" * 400 + b"}", "invalid", "delay"),
        (b'{"delay": 1e400}', "invalid", "delay"),
        (b'{"delay": 1, "payload": {"a": [1e400]}}', "invalid", "payload"),
        (b'{"delay": 1, "payload": ' + b"9" * 4301 + b"}", "invalid", "payload"),
        (
            b'{"delay": 1, "retry": {"max_attempts": 1' + b"0" * 30 + b"}}",
            "invalid",
            "retry.max_attempts",
        ),
        (b'{"delay": 1, "retry": {"max_attempts": true}}', "invalid", "retry.max_attempts"),
        (b'{"delay": 1, "retry": {"jitter": "lots"}}', "invalid", "retry.jitter"),
        (b'{"delay": 1, "retry": {"nope": 1}}', "invalid", "retry.nope"),
        (b'{"delay": 1, "queue": "q\\n"}', "invalid", "queue"),
        (b'{"delay": 1, "queue": "q\\u007f"}', "invalid", "queue"),
        (b'{"delay": 1, "idempotency_key": "\\u0000"}', "invalid", "idempotency_key"),
        (b'{"run_at": "2026-11-29T17:00:00Z\\u0000"}', "invalid", "run_at"),
        (b'{"run_at": "2026-11-29T17:00:00"}', "invalid", "run_at"),
        (b'{"run_at": "1999-12-31T23:59:59Z"}', "invalid", "run_at"),
        (
            b'{"run_at": "2030-01-01T00:00:00Z", "expires_at": "2029-12-31T00:00:00Z"}',
            "invalid",
            "expires_at",
        ),
        (b'{"delay": 10, "expires_at": "2001-01-01T00:00:00Z"}', "invalid", "expires_at"),
        (b"{}", "invalid", "run_at"),
    ],
)
def test_a_bad_create_body_names_its_field(body: bytes, code: str, field: str | None) -> None:
    error = _error(TaskCreate, body)
    assert (error.code, error.field) == (code, field)


def test_a_batch_item_is_named_by_its_place_in_the_batch() -> None:
    error = _error(TaskCreate, b'"not a task"')
    assert error.code == "malformed_json"  # a request body that is not an object
    with pytest.raises(ValidationError) as caught:
        BodyDecoder(TaskCreate).decode(b'"not a task"', root="tasks[3]")
    assert (caught.value.code, caught.value.field) == ("invalid", "tasks[3]")


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"limit": "\u00b2"}, "limit"),
        ({"limit": "\uff11"}, "limit"),
        ({"limit": "1e2"}, "limit"),
        ({"limit": "9" * 5000}, "limit"),
        ({"state": "gone"}, "state"),
        ({"queue": "a b"}, "queue"),
        ({"cursor": "0.0.0.\n"}, "cursor"),
    ],
)
def test_a_bad_query_names_its_parameter(query: dict[str, str], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        QueryDecoder(TaskQuery).decode(query)
    assert (caught.value.code, caught.value.field) == ("invalid", field)
    assert not INTERNAL.search(str(caught.value)), str(caught.value)


def test_a_query_takes_ascii_digits_and_ignores_what_it_does_not_know() -> None:
    q = QueryDecoder(TaskQuery).decode({"limit": "7", "state": "dead", "other": "x", "cursor": ""})
    assert (q.limit, q.state, q.cursor) == (7, "dead", msgspec.UNSET)


# -- any JSON at all: a decoded body or a ValidationError, nothing else ----------------

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**500), max_value=10**500)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
HOSTILE = st.sampled_from(
    ["NaN", "Infinity", "-Infinity", "1" + "0" * 400, "-1e999", "1e-999", '"\\u0000"', '"x\\n"']
)


def _field_names(kind: type[msgspec.Struct]) -> list[str]:
    info = mi.type_info(kind)
    assert isinstance(info, mi.StructType)
    return [f.encode_name for f in info.fields]


SPOT = "@hostile@"
"""Where the hostile literal goes in a body's JSON text."""


def _raw(value: Any, hostile: str) -> bytes:
    """JSON text of `value`, with the literal `hostile` at its SPOT."""
    return json.dumps(value).replace(json.dumps(SPOT), hostile).encode()


@pytest.mark.parametrize("kind", BODIES, ids=lambda t: t.__name__)
@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_any_json_is_a_body_or_a_validation_error(kind: type[msgspec.Struct], data: Any) -> None:
    names = _field_names(kind)
    body = data.draw(
        st.dictionaries(st.sampled_from([*names, "other"]), JSON, max_size=len(names) + 1)
    )
    hostile = data.draw(HOSTILE)
    spot = data.draw(st.sampled_from(names))
    body[spot] = data.draw(st.sampled_from([SPOT, [1, SPOT], {"k": SPOT}]))
    raw = _raw(body, hostile)
    try:
        BodyDecoder(kind).decode(raw)
    except ValidationError as exc:
        if hostile in ("NaN", "Infinity", "-Infinity"):
            assert exc.code == "malformed_json", (raw, exc)
        assert exc.code in ("invalid", "malformed_json")
        assert not INTERNAL.search(str(exc)), str(exc)


@pytest.mark.parametrize("kind", QUERIES, ids=lambda t: t.__name__)
@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_any_query_string_is_a_query_or_a_validation_error(
    kind: type[msgspec.Struct], data: Any
) -> None:
    names = _field_names(kind)
    query = data.draw(st.dictionaries(st.sampled_from(names), st.text(max_size=30)))
    try:
        QueryDecoder(kind).decode(query)
    except ValidationError as exc:
        assert exc.field in names
        assert not INTERNAL.search(str(exc)), str(exc)


# -- the document is the declarations' schema -----------------------------------------


def test_the_document_holds_every_declared_field_and_no_reference() -> None:
    doc = document(ENDPOINTS)
    text = json.dumps(doc["paths"])
    assert text.count('"$ref"') == text.count('{"$ref": "#/components/schemas/Error"}')
    schemas = request_schemas(ENDPOINTS)
    for kind in BODIES + QUERIES:
        assert list(schemas[kind.__name__]["properties"]) == _field_names(kind)
    tasks = doc["paths"]["/v1/tasks"]["get"]["parameters"]
    state = next(p for p in tasks if p["name"] == "state")
    assert state["schema"]["enum"][:2] == ["scheduled", "dispatched"]  # declared order
    batch = doc["paths"]["/v1/tasks/batch"]["post"]["requestBody"]["content"]
    assert batch["application/json"]["schema"]["properties"]["tasks"]["items"]["title"] == (
        "TaskCreate"
    )


def _patterns(schema: Any) -> list[str]:
    if isinstance(schema, dict):
        found = [schema["pattern"]] if "pattern" in schema else []
        return found + [p for v in schema.values() for p in _patterns(v)]
    if isinstance(schema, list):
        return [p for v in schema for p in _patterns(v)]
    return []


def test_every_documented_pattern_refuses_control_characters_and_a_final_newline() -> None:
    patterns = set(_patterns(document(ENDPOINTS)))
    assert len(patterns) >= 4
    for pattern in patterns:
        compiled = re.compile(pattern)
        for bad in ("\x00", "\n", "\x1f", "\x7f"):
            for sample in ("0.0.0.", "0-0-0", "name", "0.0."):
                assert not compiled.search(sample + bad), (pattern, sample + bad)
