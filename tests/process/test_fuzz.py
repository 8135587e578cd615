"""Property-based fuzz of the whole API from its own OpenAPI document (schemathesis):
no 5xx for any input, and every answer is one the document describes (status, content
type, body schema, headers). Bounded: MAX_EXAMPLES per operation."""

from __future__ import annotations

from typing import Any

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from timewheel.api.app import ENDPOINTS
from timewheel.api.openapi import document
from timewheel.sdk.client import Client
from timewheel.testing.apiserver import ApiServer

MAX_EXAMPLES = 100
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]

schema = schemathesis.openapi.from_dict(document(ENDPOINTS))


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_5xx_and_answers_match_the_document(
    case: schemathesis.Case[Any], api_server: ApiServer, fuzz_keys: dict[str, str]
) -> None:
    tags = case.operation.definition.raw.get("tags", [])
    key = fuzz_keys["admin"] if "admin" in tags else fuzz_keys["tenant"]
    case.call_and_validate(
        base_url=api_server.url,
        headers={"Authorization": f"Bearer {key}"},
        checks=CHECKS,
        timeout=30,
    )


def test_zz_fuzz_reached_the_handlers(api_server: ApiServer) -> None:
    """The fuzz above got past validation into the handlers, not only 4xx answers."""
    with Client(api_server.url) as anonymous:
        metrics = anonymous.metrics()
    assert 'route="/v1/tasks",status="201"' in metrics
    assert 'status="422"' in metrics
