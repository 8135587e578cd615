"""Task handlers of the HTTP API v1, and their rows of the endpoint table."""

from __future__ import annotations

import msgspec
from starlette.responses import JSONResponse, Response

from timewheel.api import task_schemas as schemas
from timewheel.api.common import JSONBytes, json_bytes
from timewheel.api.decode import BodyDecoder
from timewheel.api.endpoints import Call, Endpoint
from timewheel.api.errors import error_body, status_of
from timewheel.archive.history import RunEvent, run_history
from timewheel.engine import Engine
from timewheel.errors import (
    OverLimit,
    PayloadTooLarge,
    StorageFull,
    TaskNotFound,
    ValidationError,
)
from timewheel.limits import Limiter, Usage, runs_of
from timewheel.tasks import listing as tasklist
from timewheel.tasks.model import NewTask, Task
from timewheel.tenants import Tenant
from timewheel.types import ms_to_rfc3339


def check_tenant_payload(tenant: Tenant, payload_json: str) -> None:
    """Raise PayloadTooLarge if the payload is over the tenant's own limit."""
    limit = tenant.limits.max_payload_bytes
    size = len(payload_json.encode())
    if limit is not None and size > limit:
        raise PayloadTooLarge(
            f"payload is {size} bytes; the tenant's limit is {limit}", field="payload"
        )


def event_json(e: RunEvent) -> dict[str, object]:
    """One event of a run's history as the API shows it (schemas.EVENT)."""
    return {
        "event": e.kind,
        "at": ms_to_rfc3339(e.at_ms),
        "attempt": e.attempt,
        "reason": e.reason,
        "error": e.error,
    }


def created_json(task: Task) -> object:
    """A created (or found) task as the answer shows it: Task.to_json, with the payload's
    stored JSON text put in as it is instead of parsed and encoded again."""
    return task.json_fields(msgspec.Raw(task.payload_json))


def limiter_of(call: Call) -> Limiter:
    limiter: Limiter = call.request.app.state.limiter
    return limiter


def freed_by(task: Task) -> Usage:
    """What a task's end (cancel) takes from its tenant's usage, as lua/lib/usage.lua counts."""
    if task.schedule_id is not None:  # a schedule's run: counted in Lua, not noted here
        return Usage()
    return Usage(-1, -len(task.payload_json.encode()), 0, {task.queue: -1})


async def existing_task(engine: Engine, new: NewTask) -> Task | None:
    """The task an idempotent create made already (a retry that finds it gets it back,
    even when a limit or the storage guard would refuse a new one)."""
    task_id = engine.tasks.task_id(new)
    if task_id is None:
        return None
    try:
        return await engine.tasks.get(new.tenant, task_id)
    except TaskNotFound:
        return None


async def create_task(call: Call) -> Response:
    engine, tenant, limiter = call.engine, await call.tenant(), limiter_of(call)
    new = schemas.new_task(
        call.body(schemas.TaskCreate),
        tenant.id,
        default_queue=engine.settings.default_queue,
        idempotency_header=call.request.headers.get("idempotency-key"),
    )
    engine.tasks.check_payload(new.payload_json)
    check_tenant_payload(tenant, new.payload_json)
    adding = runs_of([new.payload_json], [new.queue])
    try:
        await limiter.check(tenant, adding)
        result = await call.request.app.state.creates.create(new)
    except (OverLimit, StorageFull):
        found = await existing_task(engine, new)
        if found is None:
            raise
        return JSONBytes(json_bytes(created_json(found)), 200)
    if result.created:
        limiter.note(tenant.id, adding)
    return JSONBytes(json_bytes(created_json(result.task)), 201 if result.created else 200)


async def get_task(call: Call) -> Response:
    task = await call.engine.tasks.get(call.tenant_id, call.path["task_id"])
    return JSONResponse(task.to_json())


async def list_tasks(call: Call) -> Response:
    q = call.query(schemas.TaskQuery)
    items, next_cursor = await tasklist.list_tasks(
        call.engine.store,
        call.tenant_id,
        queue=q.queue or None,
        state=q.state or None,
        limit=q.limit,
        cursor=q.cursor or None,
    )
    return JSONResponse({"items": [t.to_json() for t in items], "next_cursor": next_cursor})


async def update_task(call: Call) -> Response:
    engine, tenant, limiter = call.engine, await call.tenant(), limiter_of(call)
    task_id = call.path["task_id"]
    before = await engine.tasks.get(tenant.id, task_id)
    run_at_ms, delay_ms, payload_json = schemas.patch_values(call.body(schemas.TaskPatch))
    growth = Usage()
    if payload_json is not None:
        check_tenant_payload(tenant, payload_json)
        if before.schedule_id is None:
            growth = Usage(bytes=len(payload_json.encode()) - len(before.payload_json.encode()))
            await limiter.check(tenant, growth)
    task = await engine.tasks.update(
        tenant.id, task_id, run_at_ms=run_at_ms, delay_ms=delay_ms, payload_json=payload_json
    )
    limiter.note(tenant.id, growth)
    return JSONResponse(task.to_json())


async def cancel_task(call: Call) -> Response:
    tenant = await call.tenant()
    task = await call.engine.tasks.cancel(tenant.id, call.path["task_id"])
    limiter_of(call).note(tenant.id, freed_by(task))
    return JSONResponse(task.to_json())


_ITEM = BodyDecoder(schemas.TaskCreate)


async def create_batch(call: Call) -> Response:
    """Up to MAX_BATCH creates; each item is decoded and answers on its own (status, task
    or error; an item's error names its field within the item), except that a batch that
    would pass a limit of the tenant (429) or meets the storage guard (507) is refused as
    a whole, with nothing written.

    Each create call checks the tenant's cap in its shard for all of its items at once
    (lua/task_create.lua, 'all'): a batch whose items go in one call is created or
    refused whole. One spread over several calls (past CREATE_CHUNK items in a shard, or
    a tenant over several shards) that another process filled the limit under since the
    check can have some calls refused and others not: it then answers 200, each refused
    item with its own 429 (over_limit, max_pending), and nothing of those was written."""
    engine, tenant, limiter = call.engine, await call.tenant(), limiter_of(call)
    items = call.body(schemas.TaskBatch).tasks
    results: list[object] = [None] * len(items)
    valid: list[tuple[int, NewTask]] = []
    for i, item in enumerate(items):
        try:
            new = schemas.new_task(
                _ITEM.decode(item, root=f"tasks[{i}]"),
                tenant.id,
                default_queue=engine.settings.default_queue,
                idempotency_header=None,
            )
            engine.tasks.check_payload(new.payload_json)
            check_tenant_payload(tenant, new.payload_json)
            valid.append((i, new))
        except ValidationError as exc:
            results[i] = {"status": status_of(exc), "error": error_body(exc)}
    await limiter.check(
        tenant, runs_of([new.payload_json for _, new in valid], [new.queue for _, new in valid])
    )
    outcomes = (
        await engine.tasks.create_checked([new for _, new in valid], caps=limiter.cap, whole=True)
        if valid
        else []
    )
    made = [
        new
        for (_, new), res in zip(valid, outcomes, strict=True)
        if not isinstance(res, OverLimit) and res.created
    ]
    refused = [res for res in outcomes if isinstance(res, OverLimit)]
    if refused and not made:
        raise refused[0]  # nothing was written: the batch is refused whole
    limiter.note(tenant.id, runs_of([n.payload_json for n in made], [n.queue for n in made]))
    for (i, _), res in zip(valid, outcomes, strict=True):
        if isinstance(res, OverLimit):
            results[i] = {"status": status_of(res), "error": error_body(res)}
        else:
            results[i] = {"status": 201 if res.created else 200, "task": created_json(res.task)}
    return JSONBytes(json_bytes({"results": results}))


async def task_runs(call: Call) -> Response:
    engine, tenant = call.engine, call.tenant_id
    task = await engine.tasks.get(tenant, call.path["task_id"])
    events = await run_history(engine.store, tenant, task.run_id)
    return JSONResponse({"run_id": task.run_id, "events": [event_json(e) for e in events]})


S = schemas
_TASK = "/v1/tasks/{task_id}"

# fmt: off
TASK_ENDPOINTS = [
    Endpoint("POST", "/v1/tasks", create_task, "createTask", "Schedule a one-shot task",
             body=S.TaskCreate, status=201, response=S.TASK, errors=(429, 507),
             extra_statuses=(200,)),
    Endpoint("POST", "/v1/tasks/batch", create_batch, "createTasks",
             "Schedule up to 1,000 tasks (a body of at most 16 MiB); a result per item",
             body=S.TaskBatch, response=S.BATCH_OUT, errors=(429, 507), max_body_bytes=16 << 20),
    Endpoint("GET", "/v1/tasks", list_tasks, "listTasks",
             "The tenant's tasks, filtered, a page at a time (follow next_cursor to null)",
             query=S.TaskQuery, response=S.TASK_PAGE_OUT),
    Endpoint("GET", _TASK, get_task, "getTask", "A task", response=S.TASK),
    Endpoint("PATCH", _TASK, update_task, "updateTask",
             "Reschedule and/or replace the payload (while scheduled)", body=S.TaskPatch,
             response=S.TASK, errors=(409, 429)),
    Endpoint("DELETE", _TASK, cancel_task, "cancelTask", "Cancel (while scheduled)",
             response=S.TASK, errors=(409,)),
    Endpoint("GET", _TASK + "/runs", task_runs, "getTaskRuns", "The run's history",
             response=S.RUNS_OUT),
]
# fmt: on
