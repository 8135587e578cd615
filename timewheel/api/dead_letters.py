"""Dead-letter handlers of the HTTP API v1 (list, replay, purge), their query and
response shapes, and their rows of the endpoint table."""

from __future__ import annotations

import json
from typing import Annotated

from msgspec import UNSET, Meta
from starlette.responses import JSONResponse, Response

from timewheel.api.common import TIME, Cursor, PageSize, page_schema
from timewheel.api.endpoints import Call, Endpoint
from timewheel.api.fields import END, Maybe, Query, Schema
from timewheel.api.tasks import limiter_of
from timewheel.limits import Usage
from timewheel.runs import dead_letters as deadletters
from timewheel.types import ms_to_rfc3339


class DeadLetterQuery(Query):
    """The page of the dead-letter list."""

    limit: PageSize = 100
    cursor: Maybe[Annotated[Cursor, Meta(pattern="^[0-9]{1,4}-[0-9]{1,20}-[0-9]{1,20}" + END)]] = (
        UNSET
    )


DEAD_PAGE_OUT = page_schema(
    "DeadLetterPage",
    {
        "type": "object",
        "properties": {
            "run_id": {"type": "string"},
            "queue": {"type": "string"},
            "attempt": {"type": "integer"},
            "reason": {"type": "string"},
            "error": {"type": "string"},
            "dead_at": TIME,
            "run_at": TIME,
            "payload": {},
        },
    },
)

REPLAY_OUT: Schema = {
    "type": "object",
    "required": ["run_id", "state", "run_at"],
    "properties": {"run_id": {"type": "string"}, "state": {"type": "string"}, "run_at": TIME},
}

PURGE_OUT: Schema = {
    "type": "object",
    "required": ["run_id", "purged"],
    "properties": {"run_id": {"type": "string"}, "purged": {"type": "boolean"}},
}


async def list_dead_letters(call: Call) -> Response:
    q = call.query(DeadLetterQuery)
    items, next_cursor = await deadletters.list_dead(
        call.engine.store, call.tenant_id, limit=q.limit, after=q.cursor or None
    )
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


async def replay_dead_letter(call: Call) -> Response:
    run_id = call.path["run_id"]
    tenant, limiter = await call.tenant(), limiter_of(call)
    await limiter.check(tenant, Usage(runs=1))
    due_ms = await deadletters.replay(call.engine.store, tenant.id, run_id, caps=limiter.cap)
    limiter.note(tenant.id, Usage(runs=1))
    return JSONResponse({"run_id": run_id, "state": "scheduled", "run_at": ms_to_rfc3339(due_ms)})


async def purge_dead_letter(call: Call) -> Response:
    run_id = call.path["run_id"]
    await deadletters.purge(call.engine.store, call.tenant_id, run_id)
    return JSONResponse({"run_id": run_id, "purged": True})


# fmt: off
DEAD_LETTER_ENDPOINTS = [
    Endpoint("GET", "/v1/dead-letters", list_dead_letters, "listDeadLetters",
             "The tenant's dead letters, oldest first", query=DeadLetterQuery,
             response=DEAD_PAGE_OUT),
    Endpoint("POST", "/v1/dead-letters/{run_id}/replay", replay_dead_letter,
             "replayDeadLetter", "Put a dead run back into the wheel, due now",
             response=REPLAY_OUT, errors=(429, 507)),
    Endpoint("DELETE", "/v1/dead-letters/{run_id}", purge_dead_letter, "purgeDeadLetter",
             "Delete a dead run for good", response=PURGE_OUT),
]
# fmt: on
