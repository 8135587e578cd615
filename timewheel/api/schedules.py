"""Schedule handlers of the HTTP API v1, and their rows of the endpoint table."""

from __future__ import annotations

from msgspec import UNSET
from starlette.responses import JSONResponse, Response

from timewheel.api import schedule_schemas as S
from timewheel.api.endpoints import Call, Endpoint
from timewheel.api.fields import ms
from timewheel.api.tasks import check_tenant_payload, event_json, limiter_of
from timewheel.archive.history import schedule_history
from timewheel.engine import Engine
from timewheel.errors import InvalidState, OverLimit, StorageFull, TaskNotFound
from timewheel.limits import Usage, check_interval, runs_of
from timewheel.schedules import listing as schedulelist
from timewheel.schedules.model import NewSchedule, Schedule, ScheduleChanges
from timewheel.tenants import Tenant


async def existing_schedule(engine: Engine, new: NewSchedule) -> Schedule | None:
    """The schedule an idempotent create made already (see existing_task)."""
    sid = engine.schedules.schedule_id(new)
    if sid is None:
        return None
    try:
        return await engine.schedules.get(new.tenant, sid)
    except TaskNotFound:
        return None


async def create_schedule(call: Call) -> Response:
    engine, tenant, limiter = call.engine, await call.tenant(), limiter_of(call)
    new = S.new_schedule(
        call.body(S.ScheduleCreate),
        tenant.id,
        default_queue=engine.settings.default_queue,
        idempotency_header=call.request.headers.get("idempotency-key"),
    )
    check_tenant_payload(tenant, new.payload_json)
    await check_interval(new.spec, limiter.limits(tenant))
    adding = Usage(0, len(new.payload_json.encode()), 1, {new.queue: 1})
    try:
        await limiter.check(tenant, adding)
        schedule, created = await engine.schedules.create(new)
    except (OverLimit, StorageFull):
        found = await existing_schedule(engine, new)
        if found is None:
            raise
        return JSONResponse(found.to_json(), status_code=200)
    if created:
        limiter.note(tenant.id, adding)
    return JSONResponse(schedule.to_json(), status_code=201 if created else 200)


async def list_schedules(call: Call) -> Response:
    q = call.query(S.ScheduleQuery)
    items, next_cursor = await schedulelist.list_schedules(
        call.engine.store, call.tenant_id, limit=q.limit, cursor=q.cursor or None
    )
    return JSONResponse({"items": [s.to_json() for s in items], "next_cursor": next_cursor})


async def get_schedule(call: Call) -> Response:
    schedule = await call.engine.schedules.get(call.tenant_id, call.path["schedule_id"])
    return JSONResponse(schedule.to_json())


async def _check_changes(call: Call, tenant: Tenant, sid: str, changes: ScheduleChanges) -> Usage:
    """Check a change of timing, queue or payload against the tenant's limits; what it
    changes in the tenant's usage."""
    if changes.spec is None and changes.queue is None and changes.payload_json is None:
        return Usage()
    engine, limiter = call.engine, limiter_of(call)
    current = await engine.schedules.get(tenant.id, sid)
    limits = limiter.limits(tenant)
    if changes.spec is not None:
        spec = changes.spec(current.spec) if callable(changes.spec) else changes.spec
        await check_interval(spec, limits)
    queues: dict[str, int] = {}
    if changes.queue is not None and changes.queue != current.queue:
        queues = {changes.queue: 1, current.queue: -1}
    growth = 0
    if changes.payload_json is not None:
        growth = len(changes.payload_json.encode()) - len(current.payload_json.encode())
    change = Usage(0, growth, 0, queues)
    await limiter.check(tenant, change)
    return change


async def update_schedule(call: Call) -> Response:
    engine, tenant = call.engine, await call.tenant()
    sid = call.path["schedule_id"]
    data = call.body(S.SchedulePatch)
    changes = S.schedule_changes(data)
    if changes.payload_json is not None:
        engine.tasks.check_payload(changes.payload_json)
        check_tenant_payload(tenant, changes.payload_json)
    change = await _check_changes(call, tenant, sid, changes)
    paused = data.paused
    if paused is not UNSET and changes != ScheduleChanges():
        # Several writes: the checks of the last one come before the first.
        current = await engine.schedules.get(tenant.id, sid)
        new_timing = S.timing(data)
        if new_timing is not None:
            new_timing(current.spec)  # InvalidSchedule before anything is written
        if paused is False and current.state == "ended":
            raise InvalidState(sid, current.state, "resume")
    schedule = None
    if paused is True:
        schedule = await engine.schedules.pause(tenant.id, sid)
    if changes != ScheduleChanges():
        schedule = await engine.schedules.update(tenant.id, sid, changes)
        limiter_of(call).note(tenant.id, change)
    if paused is False:
        schedule = await engine.schedules.resume(tenant.id, sid)
    if schedule is None:  # a body the spec lets through changes something; be safe
        schedule = await engine.schedules.get(tenant.id, sid)
    return JSONResponse(schedule.to_json())


async def delete_schedule(call: Call) -> Response:
    sid = call.path["schedule_id"]
    current = await call.engine.schedules.get(call.tenant_id, sid)
    dropped = await call.engine.schedules.delete(call.tenant_id, sid)
    freed = Usage(0, -len(current.payload_json.encode()), -1, {current.queue: -1})
    limiter_of(call).note(call.tenant_id, freed)
    return JSONResponse({"id": sid, "deleted": True, "runs_dropped": dropped})


async def pause_schedule(call: Call) -> Response:
    schedule = await call.engine.schedules.pause(call.tenant_id, call.path["schedule_id"])
    return JSONResponse(schedule.to_json())


async def resume_schedule(call: Call) -> Response:
    schedule = await call.engine.schedules.resume(call.tenant_id, call.path["schedule_id"])
    return JSONResponse(schedule.to_json())


def _runs_of(schedule: Schedule, n: int) -> Usage:
    """What n runs of a schedule asked for by hand add (they count like tasks)."""
    return runs_of([schedule.payload_json] * n, [schedule.queue] * n)


async def trigger_schedule(call: Call) -> Response:
    tenant, limiter = await call.tenant(), limiter_of(call)
    added = Usage()

    async def admit(schedule: Schedule, n: int) -> None:
        nonlocal added
        added = _runs_of(schedule, n)
        await limiter.check(tenant, added)

    run_id = await call.engine.schedules.trigger(
        tenant.id, call.path["schedule_id"], admit=admit, caps=limiter.cap
    )
    limiter.note(tenant.id, added)
    return JSONResponse({"run_id": run_id, "state": "scheduled"}, status_code=201)


async def backfill_schedule(call: Call) -> Response:
    tenant, limiter = await call.tenant(), limiter_of(call)
    sid = call.path["schedule_id"]
    data = call.body(S.Backfill)
    found: list[Schedule] = []

    async def admit(schedule: Schedule, n: int) -> None:
        found.append(schedule)
        await limiter.check(tenant, _runs_of(schedule, n))

    added, existing = await call.engine.schedules.backfill(
        tenant.id, sid, ms(data.from_), ms(data.to), admit=admit, caps=limiter.cap
    )
    if found:
        limiter.note(tenant.id, _runs_of(found[0], added))
    return JSONResponse({"id": sid, "added": added, "existing": existing})


async def schedule_runs(call: Call) -> Response:
    sid = call.path["schedule_id"]
    schedule = await call.engine.schedules.get(call.tenant_id, sid)  # the tenant's, or 404
    runs = await schedule_history(call.engine.store, sid, schedule.created_ms)
    return JSONResponse(
        {
            "schedule_id": sid,
            "runs": [
                {
                    "run_id": run.run_id,
                    "state": _state_of(run.events[-1].kind),
                    "events": [event_json(e) for e in run.events],
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
        "dead": "dead",
        "skipped": "skipped",
        "cancelled": "cancelled",
    }.get(last_event, "scheduled")


_ONE = "/v1/schedules/{schedule_id}"

# fmt: off
SCHEDULE_ENDPOINTS = [
    Endpoint("POST", "/v1/schedules", create_schedule, "createSchedule",
             "Create a recurring schedule (cron in a time zone, or every N seconds)",
             body=S.ScheduleCreate, status=201, response=S.SCHEDULE, errors=(429, 507),
             extra_statuses=(200,)),
    Endpoint("GET", "/v1/schedules", list_schedules, "listSchedules",
             "The tenant's schedules, a page at a time (follow next_cursor until null)",
             query=S.ScheduleQuery, response=S.SCHEDULE_PAGE_OUT),
    Endpoint("GET", _ONE, get_schedule, "getSchedule", "A schedule", response=S.SCHEDULE),
    Endpoint("PATCH", _ONE, update_schedule, "updateSchedule",
             "Change a schedule (its runs not yet sent are replaced at once); pause or resume",
             body=S.SchedulePatch, response=S.SCHEDULE, errors=(409, 429, 507)),
    Endpoint("DELETE", _ONE, delete_schedule, "deleteSchedule",
             "Delete a schedule and its runs not yet sent", response=S.DELETED),
    Endpoint("POST", _ONE + "/pause", pause_schedule, "pauseSchedule",
             "Stop planning; drop the runs not yet sent", response=S.SCHEDULE, errors=(409,)),
    Endpoint("POST", _ONE + "/resume", resume_schedule, "resumeSchedule",
             "Plan again; the paused span follows the catchup policy", response=S.SCHEDULE,
             errors=(409,)),
    Endpoint("POST", _ONE + "/trigger", trigger_schedule, "triggerSchedule",
             "One run now (run id <id>@manual-<ms>)", status=201, response=S.TRIGGERED,
             errors=(429, 507)),
    Endpoint("POST", _ONE + "/backfill", backfill_schedule, "backfillSchedule",
             "A run for every fire time in [from, to] (at most 1,000)", body=S.Backfill,
             response=S.BACKFILLED, errors=(429, 507)),
    Endpoint("GET", _ONE + "/runs", schedule_runs, "getScheduleRuns",
             "The schedule's runs, with their events (event log, then the archive)",
             response=S.SCHEDULE_RUNS),
]
# fmt: on
