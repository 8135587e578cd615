"""create_app(): the Starlette application, with an engine given or connected at startup."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette

from timewheel.api.errors import HANDLERS
from timewheel.api.routes import ROUTES
from timewheel.api.schedule_routes import SCHEDULE_ROUTES
from timewheel.config import Settings
from timewheel.engine import Engine


def create_app(settings: Settings | None = None, *, engine: Engine | None = None) -> Starlette:
    """The API app. With `engine`, it is used as is (and not closed); else one is connected."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if engine is not None:
            yield
            return
        owned = await Engine.connect(settings or Settings.from_env())
        app.state.engine = owned
        try:
            yield
        finally:
            await owned.close()

    app = Starlette(routes=ROUTES + SCHEDULE_ROUTES, exception_handlers=HANDLERS, lifespan=lifespan)
    if engine is not None:
        app.state.engine = engine
    return app
