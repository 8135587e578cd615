"""Operations endpoints of the HTTP API: liveness, readiness, metrics, the OpenAPI document."""

from __future__ import annotations

import contextlib
import math

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import JSONResponse, Response

from timewheel.api.endpoints import PUBLIC, Call, Endpoint
from timewheel.api.fields import Schema
from timewheel.errors import TimewheelError

STATUS_OUT: Schema = {"type": "object", "properties": {"status": {"type": "string"}}}


async def healthz(call: Call) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(call: Call) -> Response:
    if await call.engine.store.ping():
        return JSONResponse({"status": "ready"})
    return JSONResponse(
        {"error": {"code": "unavailable", "message": "Redis is unreachable", "field": None}},
        status_code=503,
    )


async def metrics(call: Call) -> Response:
    api_metrics = call.request.app.state.metrics
    store = call.engine.store
    with contextlib.suppress(TimewheelError):  # the skew is reported; it decides nothing
        await store.clock.now_ms_fresh(store.client)
    api_metrics.clock_offset.set(store.clock.skew_ms / 1000.0)
    ratio = await store.guard.used_ratio()  # a node that cannot be read counts as unknown
    api_metrics.storage_used.set(math.nan if ratio is None else ratio)
    unreplicated = store.replica_wait.unreplicated
    api_metrics.unreplicated_writes.inc(max(0, unreplicated - api_metrics.unreplicated_seen))
    api_metrics.unreplicated_seen = unreplicated
    return Response(generate_latest(api_metrics.registry), media_type=CONTENT_TYPE_LATEST)


async def openapi(call: Call) -> Response:
    return JSONResponse(call.request.app.state.openapi)


# fmt: off
OPS_ENDPOINTS = [
    Endpoint("GET", "/healthz", healthz, "healthz", "Liveness", role=PUBLIC,
             response=STATUS_OUT),
    Endpoint("GET", "/readyz", readyz, "readyz", "Readiness (Redis reachable)", role=PUBLIC,
             response=STATUS_OUT),
    Endpoint("GET", "/metrics", metrics, "metrics", "Prometheus metrics of this api process",
             role=PUBLIC, response_type="text/plain"),
    Endpoint("GET", "/openapi.json", openapi, "openapi", "This document", role=PUBLIC),
]
# fmt: on
