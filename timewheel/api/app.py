"""create_app(): the Starlette application, with an engine given or connected at startup.

A request to a literal path (`POST /v1/tasks`, `POST /v1/tasks/batch`, `/healthz`, ...)
goes straight to its endpoint through the body limits (api/bodies.py), past Starlette's
error and exception middleware and its router, which cost a single create about a tenth
of the process's CPU and add nothing there: the endpoint answers every exception itself
(api/endpoints.py). Every other request (templated paths, other methods, HEAD) takes
Starlette's way, and so does the lifespan.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Receive, Scope, Send

from timewheel.api.audit import AUDIT_ENDPOINTS
from timewheel.api.bodies import BodyLimits
from timewheel.api.coalescer import CreateCoalescer
from timewheel.api.dead_letters import DEAD_LETTER_ENDPOINTS
from timewheel.api.endpoints import Endpoint, build_routes, direct_apps
from timewheel.api.errors import HANDLERS
from timewheel.api.metrics import ApiMetrics
from timewheel.api.openapi import document
from timewheel.api.ops import OPS_ENDPOINTS
from timewheel.api.schedules import SCHEDULE_ENDPOINTS
from timewheel.api.tasks import TASK_ENDPOINTS
from timewheel.api.tenants import TENANT_ENDPOINTS
from timewheel.config import Settings
from timewheel.dispatch.rates import DispatchRates
from timewheel.engine import Engine
from timewheel.limits import Limiter
from timewheel.tenants import TenantStore

ENDPOINTS: list[Endpoint] = [
    *TASK_ENDPOINTS,
    *DEAD_LETTER_ENDPOINTS,
    *SCHEDULE_ENDPOINTS,
    *TENANT_ENDPOINTS,
    *AUDIT_ENDPOINTS,
    *OPS_ENDPOINTS,
]
"""Every endpoint: the router and /openapi.json are built from this list."""


class Api(Starlette):
    """Starlette, with its literal-path endpoints served directly (module docstring)."""

    def __init__(self, *args: Any, direct: dict[tuple[str, str], ASGIApp], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.direct = direct

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            app = self.direct.get((scope["method"], scope["path"]))
            if app is not None:
                scope["app"] = self
                await app(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def create_app(
    settings: Settings | None = None,
    *,
    engine: Engine | None = None,
    extra_endpoints: Sequence[Endpoint] = (),
) -> Starlette:
    """The API app. With `engine`, it is used as is (and not closed); else one is connected.

    The bootstrap admin key is `settings.admin_key` (TIMEWHEEL_ADMIN_KEY); tenant keys are
    in Redis.
    """
    endpoints = [*ENDPOINTS, *extra_endpoints]

    def attach(app: Starlette, eng: Engine) -> None:
        app.state.engine = eng
        app.state.limiter = limiter = Limiter(eng.store)
        app.state.creates = CreateCoalescer(eng.tasks, caps=limiter.cap)
        app.state.tenant_store = TenantStore(
            eng.client,
            eng.keys,
            admin_key=eng.settings.admin_key,
            rates=DispatchRates.of(eng.store),
            placements=eng.store.placements,
        )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if engine is not None:
            yield
            return
        owned = await Engine.connect(settings or Settings.from_env())
        attach(app, owned)
        try:
            yield
        finally:
            await owned.close()

    limits = engine.settings if engine is not None else settings or Settings.from_env()
    max_body = limits.http_max_body_bytes
    body_limits = Middleware(BodyLimits, max_bytes=max_body)
    direct: dict[tuple[str, str], ASGIApp] = {
        route: BodyLimits(endpoint_app, max_bytes=max_body)
        for route, endpoint_app in direct_apps(endpoints).items()
    }
    app = Api(
        routes=build_routes(endpoints),
        middleware=[body_limits],
        exception_handlers=HANDLERS,
        lifespan=lifespan,
        direct=direct,
    )
    app.state.metrics = ApiMetrics()
    app.state.openapi = document(endpoints)
    if engine is not None:
        attach(app, engine)
    return app
