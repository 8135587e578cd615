"""The endpoint table: one `Endpoint` per (method, path), read by the router and by the
OpenAPI generator (timewheel/api/openapi.py).

A request goes: authenticate (role) -> read the body and decode it with the endpoint's
declaration (a msgspec.Struct, api/fields.py) -> decode the query string the same way ->
handler(call) -> response; any exception becomes a response in timewheel/api/errors.py.
Nothing is written before the body and the query are checked. Request metrics are
counted here, per route template.

Adding endpoints: a resource module (timewheel/api/schedules.py, say) exports a list of
`Endpoint`s and pass it to `create_app(extra_endpoints=...)` or append it to
`timewheel.api.app.ENDPOINTS`; the router and /openapi.json pick it up.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from timewheel.api.decode import BodyDecoder, QueryDecoder
from timewheel.api.errors import OUTAGE, response_for
from timewheel.api.fields import Body, Query, Schema
from timewheel.api.metrics import ApiMetrics
from timewheel.engine import Engine
from timewheel.errors import Forbidden, NotFound, PayloadTooLarge, RedisUnavailable, Unauthorized
from timewheel.tenants import ADMIN, TENANT, Principal, Tenant, TenantStore

PUBLIC = "public"
ANY_KEY = "any"
"""An endpoint's role: an admin key or a tenant's key (the handler tells them apart)."""
T = TypeVar("T", bound=msgspec.Struct)


@dataclass
class Call:
    """What a handler gets: the request, the parsed body and query, who is calling."""

    request: Request
    engine: Engine
    store: TenantStore
    principal: Principal | None
    data: msgspec.Struct | None = None
    """The body, decoded with the endpoint's declaration."""
    params: msgspec.Struct | None = None
    """The query string, decoded with the endpoint's declaration."""

    def body(self, kind: type[T]) -> T:
        """The decoded body, as the endpoint declares it."""
        assert isinstance(self.data, kind)
        return self.data

    def query(self, kind: type[T]) -> T:
        """The decoded query string, as the endpoint declares it."""
        assert isinstance(self.params, kind)
        return self.params

    @property
    def path(self) -> Mapping[str, str]:
        return self.request.path_params

    @property
    def tenant_id(self) -> str:
        assert self.principal is not None and self.principal.tenant is not None
        return self.principal.tenant

    async def tenant(self) -> Tenant:
        """The caller's tenant record (limits), cached for about a second."""
        return await self.store.get_tenant(self.tenant_id, cached=True)


Handler = Callable[[Call], Awaitable[Response]]


@dataclass(frozen=True)
class Endpoint:
    """One operation of the API."""

    method: str
    path: str
    handler: Handler
    operation_id: str
    summary: str
    role: str = TENANT
    """public | tenant (a tenant key) | admin (an admin key) | any (either key)."""
    body: type[Body] | None = None
    query: type[Query] | None = None
    status: int = 200
    response: Schema = field(default_factory=dict)
    errors: tuple[int, ...] = ()
    """Error statuses besides the ones implied by role, body and query."""
    response_type: str = "application/json"
    extra_statuses: tuple[int, ...] = ()
    """Further success statuses (e.g. 200 for an idempotent repeat of a 201 create)."""
    max_body_bytes: int | None = None
    """Largest request body; None: twice the deployment's max payload plus 64 KiB."""


async def read_body(request: Request, limit: int) -> bytes:
    """The body's bytes, refused with 413 past `limit` bytes without reading on."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body over {limit} bytes", field="payload")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body over {limit} bytes", field="payload")
        chunks.append(chunk)
    return b"".join(chunks)


async def _authorize(store: TenantStore, request: Request, role: str) -> Principal | None:
    if role == PUBLIC:
        return None
    principal = await store.authenticate(request.headers.get("authorization"))
    if role == ANY_KEY:
        role = principal.role
    if principal.role != role:
        raise Forbidden(
            "this endpoint needs an admin key"
            if role == ADMIN
            else "this endpoint needs a tenant's key, not an admin key"
        )
    if role == TENANT:
        try:
            await store.get_tenant(principal.tenant or "", cached=True)
        except NotFound as exc:  # a key whose tenant is gone is no key
            raise Unauthorized("the key's tenant does not exist") from exc
    return principal


class _EndpointApp:
    """The ASGI app of one endpoint. A plain ASGI callable, not a function, so Starlette
    does not wrap it in another request/exception layer: errors are answered here,
    through timewheel/api/errors.py, and counted in the metrics with their status."""

    def __init__(self, endpoint: Endpoint):
        self.endpoint = endpoint
        self.body = None if endpoint.body is None else BodyDecoder(endpoint.body)
        self.query = None if endpoint.query is None else QueryDecoder(endpoint.query)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        response = await self.respond(request)
        await response(scope, receive, send)

    async def respond(self, request: Request) -> Response:
        endpoint = self.endpoint
        started = time.perf_counter()
        state = request.app.state
        try:
            principal = await _authorize(state.tenant_store, request, endpoint.role)
            call = Call(request, state.engine, state.tenant_store, principal)
            if self.body is not None:
                limit = endpoint.max_body_bytes or (
                    state.engine.settings.max_payload_bytes * 2 + 65_536
                )
                call.data = self.body.decode(await read_body(request, limit))
            if self.query is not None:
                call.params = self.query.decode(request.query_params)
            response = await endpoint.handler(call)
        except Exception as exc:
            await _start_afresh(state.engine.client, exc)
            response = response_for(request, exc)
        metrics: ApiMetrics = state.metrics
        metrics.observe(endpoint.method, endpoint.path, response.status_code, started)
        return response


async def _start_afresh(client: Any, exc: Exception) -> None:
    """After a request met a Redis outage, a Cluster client drops its connections and
    topology, so the next request connects afresh from the startup nodes. Its node
    connections from before a Cluster was rebuilt on the same ports otherwise failed one
    command each, its own topology refresh included ("Connection closed by server"): 503s
    with the Cluster up again."""
    if isinstance(client, RedisCluster) and isinstance(exc, (*OUTAGE, RedisUnavailable)):
        with contextlib.suppress(*OUTAGE, RedisError):
            await client.aclose()


def _route(endpoint: Endpoint) -> Route:
    return Route(
        endpoint.path,
        _EndpointApp(endpoint),
        methods=[endpoint.method],
        name=endpoint.operation_id,
    )


def direct_apps(endpoints: list[Endpoint]) -> dict[tuple[str, str], _EndpointApp]:
    """The endpoints of literal paths by (method, path): the app serves these without
    Starlette's router (timewheel/api/app.py)."""
    return {(e.method, e.path): _EndpointApp(e) for e in endpoints if "{" not in e.path}


def build_routes(endpoints: list[Endpoint]) -> list[Route]:
    """Starlette routes for the table. Literal paths go before templated ones of the same
    prefix (`/v1/tasks/batch` before `/v1/tasks/{task_id}`), as Starlette matches in order."""
    ordered = sorted(endpoints, key=lambda e: (e.path.count("{"), -len(e.path)))
    return [_route(e) for e in ordered]
