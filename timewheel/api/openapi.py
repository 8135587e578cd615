"""The OpenAPI 3.1 document, generated from the endpoint table and its field specs."""

from __future__ import annotations

import re
from typing import Any

from timewheel import __version__
from timewheel.api import common as schemas
from timewheel.api.endpoints import PUBLIC, Endpoint

REASONS = {
    400: "the body is not a JSON object (malformed_json); or the HTTP server could not read "
    "the request (a malformed header such as Content-Length: plain text, not JSON)",
    401: "no API key, or an unknown or revoked one (unauthorized)",
    403: "the key's role may not use this endpoint (forbidden)",
    404: "unknown id, or another tenant's (not_found)",
    409: "state conflict (invalid_state, conflict)",
    413: "payload or body too large (payload_too_large)",
    422: "a field is invalid (invalid; field names it)",
    429: "the tenant is over a limit (over_limit); see Retry-After",
    503: "Redis is unavailable (unavailable)",
}


def _errors(e: Endpoint) -> list[int]:
    codes = set(e.errors) | {400}  # the HTTP server answers malformed protocol input itself
    if e.role != PUBLIC:
        codes |= {401, 403, 503}
    if "{" in e.path:
        codes.add(404)
    if e.body is not None:
        codes |= {413, 422}
    if e.query is not None:
        codes.add(422)
    return sorted(codes)


def _operation(e: Endpoint) -> dict[str, Any]:
    op: dict[str, Any] = {"operationId": e.operation_id, "summary": e.summary}
    params: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in re.findall(r"{(\w+)}", e.path)
    ]
    if e.query is not None:
        for name, param in e.query.params.items():
            params.append(
                {"name": name, "in": "query", "required": False, "schema": param.spec.documented()}
            )
    if e.operation_id in ("createTask", "createTasks"):
        params.append(
            {
                "name": "Idempotency-Key",
                "in": "header",
                "required": False,
                "schema": {"type": "string", "minLength": 1, "maxLength": 255},
            }
        )
    if params:
        op["parameters"] = params
    if e.body is not None:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": e.body.documented()}},
        }
    if e.response_type == "application/json":
        content = {"application/json": {"schema": e.response}}
    else:
        content = {e.response_type: {"schema": {"type": "string"}}}
    responses: dict[str, Any] = {}
    for status in (e.status, *e.extra_statuses):
        responses[str(status)] = {"description": "success", "content": content}
    for status in _errors(e):
        response: dict[str, Any] = {
            "description": REASONS[status],
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
        if status == 400:  # the HTTP server's own answer to a request it cannot read
            response["content"]["text/plain"] = {"schema": {"type": "string"}}
        if status == 429:
            response["headers"] = {"Retry-After": {"schema": {"type": "integer"}}}
        responses[str(status)] = response
    op["responses"] = responses
    if e.role != PUBLIC:
        op["security"] = [{"bearer": []}]
        op["tags"] = ["admin" if e.role == "admin" else "tenant"]
    return op


def document(endpoints: list[Endpoint]) -> dict[str, Any]:
    """The OpenAPI document of these endpoints."""
    paths: dict[str, dict[str, Any]] = {}
    for e in endpoints:
        paths.setdefault(e.path, {})[e.method.lower()] = _operation(e)
    return {
        "openapi": "3.1.0",
        "info": {"title": "timewheel", "version": __version__},
        "paths": paths,
        "components": {
            "schemas": {"Error": schemas.ERROR},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
