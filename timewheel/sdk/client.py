"""The blocking Python SDK of the HTTP API, on httpx.

    from timewheel.client import Client
    with Client("http://127.0.0.1:8080", key="tw_...") as tw:
        task = tw.create_task(delay=30, queue="emails", payload={"to": "a@b.c"})
        print(tw.get_task(task["id"])["state"])

Errors are the `ApiError` subclasses of timewheel/sdk/errors.py, one per status
(NotFoundError, ConflictError, RateLimitedError ...); an unreachable server is
`TransportError`. Connection errors are retried (3 times, backoff from 0.1 s) for
idempotent calls only: reads, and creates, which always carry an idempotency key
(generated when the caller gives none, so a create retried after a lost answer finds
the task the first one made). `url` and `key` default to TIMEWHEEL_URL and TIMEWHEEL_KEY.
Each method sends the request its namesake in timewheel/sdk/requests.py builds; the
asyncio client (timewheel/sdk/async_client.py) has the same methods, awaited.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from datetime import datetime
from types import TracebackType
from typing import Any, Self, Unpack, cast

import httpx

from timewheel.sdk.async_client import AsyncClient
from timewheel.sdk.requests import (
    UNSET,
    ApiKey,
    BatchItem,
    ClientConfig,
    DeadLetter,
    DeadLetterPage,
    Request,
    Requests,
    RunEvent,
    RunHistory,
    Schedule,
    ScheduleFields,
    SchedulePage,
    State,
    Task,
    TaskFields,
    TaskPage,
    Tenant,
    TenantLimits,
    get,
    raise_for,
)

__all__ = [
    "ApiKey",
    "AsyncClient",
    "BatchItem",
    "Client",
    "DeadLetter",
    "DeadLetterPage",
    "Request",
    "RunEvent",
    "RunHistory",
    "Task",
    "TaskPage",
    "Tenant",
    "raise_for",
]

R = Requests


class Client:
    """Blocking client of the HTTP API. Use as a context manager, or call close()."""

    def __init__(
        self,
        url: str | None = None,
        key: str | None = None,
        *,
        timeout_s: float = 10.0,
        retries: int = 3,
        transport: httpx.BaseTransport | None = None,
    ):
        self._cfg = ClientConfig(url, key, timeout_s, retries)
        self._http = httpx.Client(
            base_url=self._cfg.url,
            headers=self._cfg.headers(),
            timeout=timeout_s,
            transport=transport,
        )

    @property
    def key(self) -> str:
        return self._cfg.key

    @property
    def url(self) -> str:
        return self._cfg.url

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def send(self, req: Request) -> httpx.Response:
        """Send a built request; raise ApiError/TransportError; return the 2xx response."""
        attempt = 0
        while True:
            try:
                resp = self._http.request(
                    req.method, req.path, json=req.json, params=req.params or None,
                    headers=req.headers,
                )  # fmt: skip
                break
            except httpx.TransportError as exc:
                time.sleep(self._cfg.retry_after_s(req, attempt, exc))
                attempt += 1
        raise_for(resp)
        return resp

    def _json(self, req: Request) -> Any:
        return self.send(req).json()

    # -- tasks -------------------------------------------------------------------------

    def create_task(self, **fields: Unpack[TaskFields]) -> Task:
        """Schedule a task: run_at or delay; queue, payload, idempotency_key, retry,
        visibility_timeout_s, expires_at, window_s."""
        return cast(Task, self._json(R.create_task(**fields)))

    def create_tasks(self, tasks: list[dict[str, Any]]) -> list[BatchItem]:
        return cast(list[BatchItem], self._json(R.create_tasks(tasks))["results"])

    def get_task(self, task_id: str) -> Task:
        return cast(Task, self._json(R.get_task(task_id)))

    def update_task(
        self,
        task_id: str,
        *,
        run_at: datetime | str | None = None,
        delay: float | None = None,
        payload: Any = UNSET,
    ) -> Task:
        """Reschedule (run_at or delay) and/or replace the payload."""
        req = R.update_task(task_id, run_at=run_at, delay=delay, payload=payload)
        return cast(Task, self._json(req))

    def cancel_task(self, task_id: str) -> Task:
        return cast(Task, self._json(R.cancel_task(task_id)))

    def list_tasks(
        self,
        *,
        queue: str | None = None,
        state: State | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> TaskPage:
        """One page; a page may be short (even empty) while next_cursor is not None."""
        req = R.list_tasks(queue=queue, state=state, limit=limit, cursor=cursor)
        return cast(TaskPage, self._json(req))

    def iter_tasks(
        self, *, queue: str | None = None, state: State | None = None, page_size: int = 1000
    ) -> Iterator[Task]:
        """Every task of the tenant (filtered), following next_cursor to its end."""
        cursor: str | None = None
        while True:
            page = self.list_tasks(queue=queue, state=state, limit=page_size, cursor=cursor)
            yield from page["items"]
            cursor = page["next_cursor"]
            if cursor is None:
                return

    def task_runs(self, task_id: str) -> RunHistory:
        return cast(RunHistory, self._json(R.task_runs(task_id)))

    # -- dead letters ------------------------------------------------------------------

    def list_dead_letters(
        self, *, limit: int | None = None, cursor: str | None = None
    ) -> DeadLetterPage:
        return cast(DeadLetterPage, self._json(R.list_dead_letters(limit=limit, cursor=cursor)))

    def replay_dead_letter(self, run_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], self._json(R.replay_dead_letter(run_id)))

    def purge_dead_letter(self, run_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], self._json(R.purge_dead_letter(run_id)))

    # -- schedules ---------------------------------------------------------------------

    def create_schedule(self, **fields: Unpack[ScheduleFields]) -> Schedule:
        """Create a recurring schedule: cron (+ timezone) or every_s."""
        return cast(Schedule, self._json(R.create_schedule(**fields)))

    def get_schedule(self, schedule_id: str) -> Schedule:
        return cast(Schedule, self._json(R.get_schedule(schedule_id)))

    def list_schedules(
        self, *, limit: int | None = None, cursor: str | None = None
    ) -> SchedulePage:
        """One page; a page may be short (even empty) while next_cursor is not None."""
        return cast(SchedulePage, self._json(R.list_schedules(limit=limit, cursor=cursor)))

    def update_schedule(self, schedule_id: str, **fields: Unpack[ScheduleFields]) -> Schedule:
        """Change the given fields of a schedule."""
        return cast(Schedule, self._json(R.update_schedule(schedule_id, **fields)))

    def delete_schedule(self, schedule_id: str) -> Schedule:
        return cast(Schedule, self._json(R.schedule_action(schedule_id, "delete")))

    def pause_schedule(self, schedule_id: str) -> Schedule:
        return cast(Schedule, self._json(R.schedule_action(schedule_id, "pause")))

    def resume_schedule(self, schedule_id: str) -> Schedule:
        return cast(Schedule, self._json(R.schedule_action(schedule_id, "resume")))

    def trigger_schedule(self, schedule_id: str) -> Schedule:
        return cast(Schedule, self._json(R.schedule_action(schedule_id, "trigger")))

    def backfill_schedule(
        self, schedule_id: str, *, start_at: datetime | str, end_at: datetime | str
    ) -> Schedule:
        req = R.backfill_schedule(schedule_id, start_at=start_at, end_at=end_at)
        return cast(Schedule, self._json(req))

    def schedule_runs(self, schedule_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], self._json(R.schedule_runs(schedule_id)))

    # -- tenants (admin) ---------------------------------------------------------------

    def create_tenant(self, tenant_id: str, **limits: Unpack[TenantLimits]) -> Tenant:
        return cast(Tenant, self._json(R.create_tenant(tenant_id, **limits)))

    def get_tenant(self, tenant_id: str) -> Tenant:
        return cast(Tenant, self._json(R.get_tenant(tenant_id)))

    def update_tenant(self, tenant_id: str, limits: Mapping[str, float | None]) -> Tenant:
        """Change some limits ({"dispatch_rate": 50}); None clears one."""
        return cast(Tenant, self._json(R.update_tenant(tenant_id, limits)))

    def create_key(self, tenant_id: str) -> ApiKey:
        return cast(ApiKey, self._json(R.create_key(tenant_id)))

    def revoke_key(self, tenant_id: str, key_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], self._json(R.revoke_key(tenant_id, key_id)))

    # -- operations --------------------------------------------------------------------

    def healthz(self) -> dict[str, Any]:
        return cast(dict[str, Any], self._json(get("/healthz")))

    def readyz(self) -> dict[str, Any]:
        return cast(dict[str, Any], self._json(get("/readyz")))

    def openapi(self) -> dict[str, Any]:
        return cast(dict[str, Any], self._json(get("/openapi.json")))

    def metrics(self) -> str:
        return self.send(get("/metrics")).text
