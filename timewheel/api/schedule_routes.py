"""Handlers of the schedule endpoints of the HTTP API v1 (DESIGN.md sections 7, 11)."""

from __future__ import annotations

import dataclasses

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from timewheel.api import schedule_schemas
from timewheel.api.routes import _body, _engine, _tenant
from timewheel.history import schedule_history
from timewheel.models import ms_to_rfc3339


async def create_schedule(request: Request) -> Response:
    engine, tenant = _engine(request), _tenant(request)
    new = schedule_schemas.parse_schedule_create(
        await _body(request),
        tenant,
        default_queue=engine.settings.default_queue,
        idempotency_header=request.headers.get("idempotency-key"),
    )
    schedule, created = await engine.create_schedule(new)
    return JSONResponse(schedule.to_json(), status_code=201 if created else 200)


async def get_schedule(request: Request) -> Response:
    engine, tenant = _engine(request), _tenant(request)
    schedule = await engine.get_schedule(tenant, request.path_params["schedule_id"])
    return JSONResponse(schedule.to_json())


async def update_schedule(request: Request) -> Response:
    engine, tenant = _engine(request), _tenant(request)
    sid = request.path_params["schedule_id"]
    current = await engine.get_schedule(tenant, sid)  # 404 before 422
    changes = schedule_schemas.parse_schedule_patch(await _body(request), current.spec)
    if changes.options is not None:
        changes = dataclasses.replace(changes, options={**current.options, **changes.options})
    schedule = await engine.update_schedule(tenant, sid, changes)
    return JSONResponse(schedule.to_json())


async def delete_schedule(request: Request) -> Response:
    sid = request.path_params["schedule_id"]
    dropped = await _engine(request).delete_schedule(_tenant(request), sid)
    return JSONResponse({"id": sid, "deleted": True, "runs_dropped": dropped})


async def pause_schedule(request: Request) -> Response:
    engine, tenant = _engine(request), _tenant(request)
    schedule = await engine.pause_schedule(tenant, request.path_params["schedule_id"])
    return JSONResponse(schedule.to_json())


async def resume_schedule(request: Request) -> Response:
    engine, tenant = _engine(request), _tenant(request)
    schedule = await engine.resume_schedule(tenant, request.path_params["schedule_id"])
    return JSONResponse(schedule.to_json())


async def trigger_schedule(request: Request) -> Response:
    engine, tenant = _engine(request), _tenant(request)
    run_id = await engine.trigger_schedule(tenant, request.path_params["schedule_id"])
    return JSONResponse({"run_id": run_id, "state": "scheduled"}, status_code=201)


async def backfill_schedule(request: Request) -> Response:
    engine, tenant = _engine(request), _tenant(request)
    sid = request.path_params["schedule_id"]
    await engine.get_schedule(tenant, sid)  # 404 before 422
    start, end = schedule_schemas.parse_backfill(await _body(request))
    added, existing = await engine.backfill_schedule(tenant, sid, start, end)
    return JSONResponse({"id": sid, "added": added, "existing": existing})


async def schedule_runs(request: Request) -> Response:
    engine, tenant = _engine(request), _tenant(request)
    sid = request.path_params["schedule_id"]
    await engine.get_schedule(tenant, sid)
    runs = await schedule_history(engine, sid)
    return JSONResponse(
        {
            "schedule_id": sid,
            "runs": [
                {
                    "run_id": run.run_id,
                    "state": _state_of(run.events[-1].kind),
                    "events": [
                        {
                            "event": e.kind,
                            "at": ms_to_rfc3339(e.at_ms),
                            "attempt": e.attempt,
                            "reason": e.reason,
                            "error": e.error,
                        }
                        for e in run.events
                    ],
                }
                for run in runs
            ],
        }
    )


def _state_of(last_event: str) -> str:
    """A run's state after its last event."""
    return {
        "dispatched": "dispatched",
        "acked": "succeeded",
        "retry_scheduled": "scheduled",
        "dead": "dead",
        "skipped": "skipped",
        "held": "scheduled",
        "cancelled": "cancelled",
        "replayed": "scheduled",
    }.get(last_event, "scheduled")


SCHEDULE_ROUTES = [
    Route("/v1/schedules", create_schedule, methods=["POST"]),
    Route("/v1/schedules/{schedule_id}", get_schedule, methods=["GET"]),
    Route("/v1/schedules/{schedule_id}", update_schedule, methods=["PATCH"]),
    Route("/v1/schedules/{schedule_id}", delete_schedule, methods=["DELETE"]),
    Route("/v1/schedules/{schedule_id}/pause", pause_schedule, methods=["POST"]),
    Route("/v1/schedules/{schedule_id}/resume", resume_schedule, methods=["POST"]),
    Route("/v1/schedules/{schedule_id}/trigger", trigger_schedule, methods=["POST"]),
    Route("/v1/schedules/{schedule_id}/backfill", backfill_schedule, methods=["POST"]),
    Route("/v1/schedules/{schedule_id}/runs", schedule_runs, methods=["GET"]),
]
