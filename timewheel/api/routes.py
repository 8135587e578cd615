"""Handlers of the HTTP API v1 (DESIGN.md section 11)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from timewheel.api import schemas
from timewheel.engine import Engine, validate_name
from timewheel.errors import PayloadTooLarge

TENANT_HEADER = "x-timewheel-tenant"
DEFAULT_TENANT = "default"


def _engine(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine


def _tenant(request: Request) -> str:
    # Until API keys land (issue 6), the tenant comes from a header or is `default`.
    return validate_name(request.headers.get(TENANT_HEADER, DEFAULT_TENANT), "tenant")


async def _body(request: Request) -> dict[str, object]:
    limit = _engine(request).settings.max_payload_bytes * 2 + 65_536
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body over {limit} bytes", field="payload")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body over {limit} bytes", field="payload")
        chunks.append(chunk)
    return schemas.parse_json_object(b"".join(chunks))


async def create_task(request: Request) -> Response:
    engine = _engine(request)
    tenant = _tenant(request)
    new = schemas.parse_create(
        await _body(request),
        tenant,
        default_queue=engine.settings.default_queue,
        idempotency_header=request.headers.get("idempotency-key"),
    )
    result = await engine.create(new)
    task = result.task or await engine.get(tenant, result.task_id)
    return JSONResponse(task.to_json(), status_code=201 if result.created else 200)


async def get_task(request: Request) -> Response:
    task = await _engine(request).get(_tenant(request), request.path_params["task_id"])
    return JSONResponse(task.to_json())


async def update_task(request: Request) -> Response:
    engine = _engine(request)
    tenant = _tenant(request)
    task_id = request.path_params["task_id"]
    await engine.get(tenant, task_id)  # 404 before 422: an unknown id is the first problem
    run_at_ms, delay_ms, payload_json = schemas.parse_patch(await _body(request))
    task = await engine.update(
        tenant, task_id, run_at_ms=run_at_ms, delay_ms=delay_ms, payload_json=payload_json
    )
    return JSONResponse(task.to_json())


async def cancel_task(request: Request) -> Response:
    task = await _engine(request).cancel(_tenant(request), request.path_params["task_id"])
    return JSONResponse(task.to_json())


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    if await _engine(request).ping():
        return JSONResponse({"status": "ready"})
    return JSONResponse(
        {"error": {"code": "unavailable", "message": "Redis is unreachable", "field": None}},
        status_code=503,
    )


ROUTES = [
    Route("/v1/tasks", create_task, methods=["POST"]),
    Route("/v1/tasks/{task_id}", get_task, methods=["GET"]),
    Route("/v1/tasks/{task_id}", update_task, methods=["PATCH"]),
    Route("/v1/tasks/{task_id}", cancel_task, methods=["DELETE"]),
    Route("/healthz", healthz, methods=["GET"]),
    Route("/readyz", readyz, methods=["GET"]),
]
