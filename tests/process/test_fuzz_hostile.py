"""Property-based fuzz of every endpoint with hostile values, against a real `timewheel
api` process: schemathesis makes each operation's requests from the OpenAPI document, and
Hypothesis rewrites one value of each into something hostile, in the raw JSON text of the
body (NaN and Infinity literals, integers of hundreds of digits, numbers past a float's
range, control characters in strings), in the query string (digits that are not ASCII,
control characters, very long numbers) or in a path segment.

Checked: no answer is a 5xx; every answer body is strict JSON (no NaN); a body holding a
NaN or Infinity literal is a 400 malformed_json; and after the run every listing (tasks,
schedules, dead letters) reads to its end with 200, every tenant made meanwhile reads
with 200, so nothing stored can poison a later read. Bounded: MAX_EXAMPLES per operation.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import msgspec
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from timewheel.api.app import ENDPOINTS
from timewheel.api.openapi import document
from timewheel.testing.apiserver import ApiServer

MAX_EXAMPLES = 40
NOT_JSON = ("NaN", "Infinity", "-Infinity")

schema = schemathesis.openapi.from_dict(document(ENDPOINTS))

_strict = msgspec.json.Decoder()
"""msgspec's JSON decoder: refuses NaN and Infinity, as a strict client does."""

CONTROL = st.characters(min_codepoint=0, max_codepoint=0x1F) | st.just("\x7f")
NUMBERS = st.sampled_from(
    [
        *NOT_JSON,
        "1" + "0" * 400,
        "-1" + "0" * 400,
        "9" * 5000,
        "1e400",
        "-1e999",
        "1e-999",
        "18446744073709551616",
        "-9223372036854775809",
        "0.1e308",
    ]
)
STRINGS = st.builds(
    lambda before, bad, after: json.dumps(before + bad + after),
    st.text(max_size=8),
    st.text(CONTROL, min_size=1, max_size=3),
    st.text(max_size=8),
) | st.sampled_from(['"\x00raw"', '"tab\there"', '"2026-11-29T17:00:00Z\\u0000"', '"\\ud800"'])
"""JSON strings with control characters: escaped (valid JSON), or raw (not JSON)."""

DIGITS = st.text(st.characters(categories=["Nd", "No"]), min_size=1, max_size=6).filter(
    lambda s: not s.isascii()
)
QUERY_VALUES = (
    DIGITS
    | st.builds(lambda a, b: a + b, st.text(max_size=6), st.text(CONTROL, min_size=1, max_size=2))
    | st.sampled_from(["9" * 40, "1e2", "-1", " 5", "5 ", "0x10", "\u00b2", "%00"])
)

SPOT = "@hostile@"
"""Where the hostile literal goes in the body's JSON text."""


def _with_spot(body: Any, data: st.DataObject) -> Any:
    """`body` (a JSON value from schemathesis) with SPOT at a place Hypothesis picks: a
    field's value, inside a list or an object there, or as a field of its own."""
    place = data.draw(st.sampled_from([SPOT, [SPOT], {"k": SPOT}, [1, {"x": [SPOT]}]]))
    if isinstance(body, dict) and body:
        key = data.draw(st.sampled_from([*sorted(body), "extra"]))
        return {**body, key: place}
    if isinstance(body, dict):
        return {data.draw(st.sampled_from(["payload", "delay", "id", "tasks"])): place}
    return place


def _request(case: schemathesis.Case[Any], data: st.DataObject) -> dict[str, Any]:
    """The case as httpx arguments, with one hostile value in it."""
    operation = case.operation.definition.raw
    target = data.draw(
        st.sampled_from(
            [
                *(["body"] if "requestBody" in operation else []),
                *(
                    ["query"]
                    if any(p["in"] == "query" for p in operation.get("parameters", []))
                    else []
                ),
                "path",
            ]
        )
    )
    path = case.formatted_path
    query = dict(case.query or {})
    content: bytes | None = None
    hostile = ""
    body: Any = {}
    if "requestBody" in operation:
        body = case.body if isinstance(case.body, dict | list) else {}
        try:
            content = json.dumps(body).encode()
        except (TypeError, ValueError):
            content = b"{}"
    if target == "body":
        hostile = data.draw(NUMBERS | STRINGS)
        spotted = _with_spot(body, data)
        content = json.dumps(spotted).replace(json.dumps(SPOT), hostile).encode()
    elif target == "query":
        names = [p["name"] for p in operation["parameters"] if p["in"] == "query"]
        query[data.draw(st.sampled_from(names))] = data.draw(QUERY_VALUES)
    else:
        segments = path.split("/")
        if len(segments) > 2:
            i = data.draw(st.integers(2, len(segments) - 1))
            segments[i] = quote(data.draw(QUERY_VALUES | DIGITS), safe="")
            path = "/".join(segments)
    return {
        "method": case.method,
        "url": path,
        "params": {k: str(v) for k, v in query.items()},
        "content": content,
        "headers": {"content-type": "application/json"} if content is not None else {},
        "hostile": hostile,
    }


CREATED_TENANTS: list[str] = []


@pytest.fixture(scope="module")
def http(api_server: ApiServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api_server.url, timeout=30) as client:
        yield client


@schema.given(data=st.data())
@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_hostile_values_get_4xx_and_strict_json(
    case: schemathesis.Case[Any], data: st.DataObject, http: httpx.Client, fuzz_keys: dict[str, str]
) -> None:
    tags = case.operation.definition.raw.get("tags", [])
    key = fuzz_keys["admin"] if "admin" in tags else fuzz_keys["tenant"]
    request = _request(case, data)
    hostile = request.pop("hostile")
    request["headers"]["Authorization"] = f"Bearer {key}"
    resp = http.request(**request)
    assert resp.status_code < 500, (request, resp.text)
    if resp.headers.get("content-type", "").startswith("application/json"):
        try:
            answer = _strict.decode(resp.content)
        except msgspec.DecodeError as exc:
            raise AssertionError(f"not strict JSON: {resp.content[:200]!r}") from exc
        if resp.status_code == 201 and case.operation.definition.raw["operationId"] == (
            "createTenant"
        ):
            CREATED_TENANTS.append(answer["id"])
    if hostile in NOT_JSON and resp.status_code != 400:
        # Only the router answers before the body is read: a path that is no route.
        assert resp.status_code in (307, 404, 405), (request, resp.text)
        assert resp.status_code == 307 or resp.json()["error"]["message"] in (
            "Not Found",
            "Method Not Allowed",
        ), (request, resp.text)
    elif hostile in NOT_JSON:
        assert resp.json()["error"]["code"] == "malformed_json", resp.text


def _read_to_the_end(http: httpx.Client, path: str, key: str) -> int:
    """Pages of a listing read with 200 and strict JSON until next_cursor is null."""
    cursor: str | None = None
    items = 0
    for _ in range(1000):
        params = {"limit": "100", **({"cursor": cursor} if cursor else {})}
        resp = http.get(path, params=params, headers={"Authorization": f"Bearer {key}"})
        assert resp.status_code == 200, (path, resp.text)
        page = _strict.decode(resp.content)
        items += len(page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            return items
    raise AssertionError(f"{path} did not end")


def test_zz_every_listing_still_reads_after_the_fuzz(
    http: httpx.Client, fuzz_keys: dict[str, str]
) -> None:
    assert _read_to_the_end(http, "/v1/tasks", fuzz_keys["tenant"]) >= 3
    for path in ("/v1/schedules", "/v1/dead-letters"):
        _read_to_the_end(http, path, fuzz_keys["tenant"])
    admin = {"Authorization": f"Bearer {fuzz_keys['admin']}"}
    for tenant in [fuzz_keys["id"], *CREATED_TENANTS]:
        resp = http.get(f"/v1/tenants/{quote(tenant, safe='')}", headers=admin)
        assert resp.status_code == 200, resp.text
        _strict.decode(resp.content)
