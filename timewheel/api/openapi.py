"""The OpenAPI 3.1 document, generated from the endpoint table and the msgspec
declarations of its bodies and query strings (msgspec.json.schema_components), with the
schemas written out in place so each operation reads on its own."""

from __future__ import annotations

import re
import typing
from typing import Any

import msgspec
import msgspec.inspect as mi

from timewheel import __version__
from timewheel.api import common as schemas
from timewheel.api.endpoints import PUBLIC, Endpoint
from timewheel.api.fields import IdempotencyKey, Schema

REF = "#/components/schemas/{name}"

REASONS = {
    400: "the body is not a JSON object (malformed_json); or the HTTP server could not read "
    "the request (a malformed header such as Content-Length: plain text, not JSON)",
    401: "no API key, or an unknown or revoked one (unauthorized)",
    403: "the key's role may not use this endpoint (forbidden)",
    404: "unknown id, or another tenant's (not_found)",
    409: "state conflict (invalid_state, conflict)",
    413: "payload or body too large (payload_too_large)",
    422: "a field is invalid (invalid; field names it)",
    429: "the tenant would pass one of its limits (over_limit; field names the limit); "
    "see Retry-After",
    503: "Redis is unavailable (unavailable)",
    507: "Redis is near its memory ceiling: creates are refused, nothing was written "
    "(storage_full)",
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


def _operation(e: Endpoint, components: dict[str, Schema]) -> dict[str, Any]:
    op: dict[str, Any] = {"operationId": e.operation_id, "summary": e.summary}
    params: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in re.findall(r"{(\w+)}", e.path)
    ]
    if e.query is not None:
        query = components[e.query.__name__]
        for name, schema in query["properties"].items():
            params.append({"name": name, "in": "query", "required": False, "schema": schema})
    if e.operation_id in ("createTask", "createTasks", "createSchedule"):
        params.append(
            {
                "name": "Idempotency-Key",
                "in": "header",
                "required": False,
                "schema": _plain(msgspec.json.schema(IdempotencyKey), {}),
            }
        )
    if params:
        op["parameters"] = params
    if e.body is not None:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": components[e.body.__name__]}},
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
        op["tags"] = {"admin": ["admin"], "any": ["admin", "tenant"]}.get(e.role, ["tenant"])
    return op


def request_schemas(endpoints: list[Endpoint]) -> dict[str, Schema]:
    """The JSON Schema of every body and query declaration, by class name, written out
    (no $ref), with each body's cross-field rules (anyOf, not, minProperties)."""
    types = [t for e in endpoints for t in (e.body, e.query) if t is not None]
    _, components = msgspec.json.schema_components(types, ref_template=REF)
    for info in mi.multi_type_info(types):
        _declared_order(info, components, set())
    for t in types:
        for rule in getattr(t, "rules", ()):
            components[t.__name__].update(rule.schema())
    return {name: _plain(schema, components) for name, schema in components.items()}


def _declared_order(t: mi.Type, components: dict[str, Schema], seen: set[str]) -> None:
    """Enums listed in the order of their declaration (msgspec sorts them)."""
    while isinstance(t, mi.Metadata):
        t = t.type
    if isinstance(t, mi.UnionType):
        for member in t.types:
            _declared_order(member, components, seen)
    if not isinstance(t, mi.StructType) or t.cls.__name__ in seen:
        return
    seen.add(t.cls.__name__)
    properties = components[t.cls.__name__]["properties"]
    hints = typing.get_type_hints(t.cls, include_extras=True)
    for f in t.fields:
        values = _literal(hints[f.name])
        if values:
            properties[f.encode_name]["enum"] = values
        _declared_order(f.type, components, seen)


def _literal(hint: Any) -> list[Any]:
    """The values of the Literal inside an annotation, in their order ([] if none)."""
    if typing.get_origin(hint) is typing.Literal:
        return list(typing.get_args(hint))
    for arg in typing.get_args(hint):
        values = _literal(arg)
        if values:
            return values
    return []


def _plain(schema: Any, components: dict[str, Schema]) -> Any:
    """`schema` with its $refs replaced by what they name, a nullable type as a type list
    (`["string", "null"]`), an enum of strings typed, and no empty `required`."""
    if isinstance(schema, list):
        return [_plain(item, components) for item in schema]
    if not isinstance(schema, dict):
        return schema
    if "$ref" in schema:
        target = components[schema["$ref"].rsplit("/", 1)[-1]]
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        return _plain({**target, **rest}, components)
    out = {k: _plain(v, components) for k, v in schema.items()}
    alternatives = out.get("anyOf")
    if isinstance(alternatives, list) and {"type": "null"} in alternatives:
        others = [a for a in alternatives if a != {"type": "null"}]
        if len(others) == 1 and isinstance(others[0].get("type"), str):
            del out["anyOf"]
            out = {**others[0], **out, "type": [others[0]["type"], "null"]}
    if "enum" in out and "type" not in out and all(isinstance(v, str) for v in out["enum"]):
        out = {"type": "string", **out}
    if out.get("required") == []:
        del out["required"]
    return out


def document(endpoints: list[Endpoint]) -> dict[str, Any]:
    """The OpenAPI document of these endpoints."""
    components = request_schemas(endpoints)
    paths: dict[str, dict[str, Any]] = {}
    for e in endpoints:
        paths.setdefault(e.path, {})[e.method.lower()] = _operation(e, components)
    return {
        "openapi": "3.1.0",
        "info": {"title": "timewheel", "version": __version__},
        "paths": paths,
        "components": {
            "schemas": {"Error": schemas.ERROR},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
