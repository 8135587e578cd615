"""create_app(): the Starlette application, with an engine given or connected at startup."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.middleware import Middleware

from timewheel.api.bodies import BodyLimits
from timewheel.api.coalescer import CreateCoalescer
from timewheel.api.dead_letters import DEAD_LETTER_ENDPOINTS
from timewheel.api.endpoints import Endpoint, build_routes
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
    *OPS_ENDPOINTS,
]
"""Every endpoint: the router and /openapi.json are built from this list."""


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
        app.state.creates = CreateCoalescer(eng.tasks)
        app.state.limiter = Limiter(eng.store)
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
    body_limits = Middleware(BodyLimits, max_bytes=limits.http_max_body_bytes)
    app = Starlette(
        routes=build_routes(endpoints),
        middleware=[body_limits],
        exception_handlers=HANDLERS,
        lifespan=lifespan,
    )
    app.state.metrics = ApiMetrics()
    app.state.openapi = document(endpoints)
    if engine is not None:
        attach(app, engine)
    return app
