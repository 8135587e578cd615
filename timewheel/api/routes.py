"""Handlers of the HTTP API v1 (DESIGN.md section 11)."""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from timewheel import deadletters
from timewheel.api import schemas
from timewheel.api.errors import error_body, status_of
from timewheel.engine import Engine, NewTask, validate_name
from timewheel.errors import PayloadTooLarge, ValidationError
from timewheel.history import run_history
from timewheel.models import ms_to_rfc3339

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


async def create_batch(request: Request) -> Response:
    """Up to MAX_BATCH creates; each item answers on its own (status, task or error)."""
    engine = _engine(request)
    tenant = _tenant(request)
    items = schemas.parse_batch(await _body(request))
    results: list[dict[str, object] | None] = [None] * len(items)
    valid: list[tuple[int, NewTask]] = []
    for i, item in enumerate(items):
        try:
            if not isinstance(item, dict):
                raise ValidationError("each task must be a JSON object", field=f"tasks[{i}]")
            new = schemas.parse_create(
                item, tenant, default_queue=engine.settings.default_queue, idempotency_header=None
            )
            engine.check_payload(new.payload_json)
            valid.append((i, new))
        except ValidationError as exc:
            results[i] = {"status": status_of(exc), "error": error_body(exc)}
    created = await engine.create_many([new for _, new in valid]) if valid else []
    for (i, new), res in zip(valid, created, strict=True):
        if res.task is not None:
            results[i] = {"status": 200, "task": res.task.to_json()}
        else:
            results[i] = {
                "status": 201,
                "task": {
                    "id": res.task_id,
                    "run_id": res.task_id,
                    "queue": new.queue,
                    "state": "scheduled",
                    "attempt": 0,
                    "run_at": ms_to_rfc3339(res.due_ms),
                },
            }
    return JSONResponse({"results": results})


async def task_runs(request: Request) -> Response:
    engine, tenant = _engine(request), _tenant(request)
    task = await engine.get(tenant, request.path_params["task_id"])
    events = await run_history(engine, tenant, task.run_id)
    return JSONResponse(
        {
            "run_id": task.run_id,
            "events": [
                {
                    "event": e.kind,
                    "at": ms_to_rfc3339(e.at_ms),
                    "attempt": e.attempt,
                    "reason": e.reason,
                    "error": e.error,
                }
                for e in events
            ],
        }
    )


async def list_dead_letters(request: Request) -> Response:
    engine, tenant = _engine(request), _tenant(request)
    limit, cursor = schemas.parse_page(request.query_params)
    items, next_cursor = await deadletters.list_dead(engine, tenant, limit=limit, after=cursor)
    return JSONResponse(
        {
            "items": [
                {
                    "run_id": d.run_id,
                    "queue": d.queue,
                    "attempt": d.attempt,
                    "reason": d.reason,
                    "error": d.error,
                    "dead_at": ms_to_rfc3339(d.dead_ms),
                    "run_at": ms_to_rfc3339(d.due_ms),
                    "payload": json.loads(d.payload_json) if d.payload_json else None,
                }
                for d in items
            ],
            "next_cursor": next_cursor,
        }
    )


async def replay_dead_letter(request: Request) -> Response:
    run_id = request.path_params["run_id"]
    due_ms = await deadletters.replay(_engine(request), _tenant(request), run_id)
    return JSONResponse({"run_id": run_id, "state": "scheduled", "run_at": ms_to_rfc3339(due_ms)})


async def purge_dead_letter(request: Request) -> Response:
    run_id = request.path_params["run_id"]
    await deadletters.purge(_engine(request), _tenant(request), run_id)
    return JSONResponse({"run_id": run_id, "purged": True})


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
    Route("/v1/tasks/batch", create_batch, methods=["POST"]),
    Route("/v1/tasks/{task_id}/runs", task_runs, methods=["GET"]),
    Route("/v1/dead-letters", list_dead_letters, methods=["GET"]),
    Route("/v1/dead-letters/{run_id}/replay", replay_dead_letter, methods=["POST"]),
    Route("/v1/dead-letters/{run_id}", purge_dead_letter, methods=["DELETE"]),
    Route("/v1/tasks/{task_id}", get_task, methods=["GET"]),
    Route("/v1/tasks/{task_id}", update_task, methods=["PATCH"]),
    Route("/v1/tasks/{task_id}", cancel_task, methods=["DELETE"]),
    Route("/healthz", healthz, methods=["GET"]),
    Route("/readyz", readyz, methods=["GET"]),
]
