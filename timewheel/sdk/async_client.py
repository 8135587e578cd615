"""The asyncio Python SDK of the HTTP API, on httpx: the same methods as
timewheel/sdk/client.py's Client, awaited.

    from timewheel.client import AsyncClient
    async with AsyncClient() as tw:                  # TIMEWHEEL_URL, TIMEWHEEL_KEY
        task = await tw.create_task(delay=30, payload={"report": "daily"})
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from datetime import datetime
from types import TracebackType
from typing import Any, Self, Unpack, cast

import httpx

from timewheel.sdk.requests import (
    UNSET,
    ApiKey,
    BatchItem,
    ClientConfig,
    DeadLetterPage,
    Request,
    Requests,
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

R = Requests


class AsyncClient:
    """asyncio client of the HTTP API. Use as an async context manager, or call aclose()."""

    def __init__(
        self,
        url: str | None = None,
        key: str | None = None,
        *,
        timeout_s: float = 10.0,
        retries: int = 3,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        self._cfg = ClientConfig(url, key, timeout_s, retries)
        self._http = httpx.AsyncClient(
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

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def send(self, req: Request) -> httpx.Response:
        """Send a built request; raise ApiError/TransportError; return the 2xx response."""
        attempt = 0
        while True:
            try:
                resp = await self._http.request(
                    req.method, req.path, json=req.json, params=req.params or None,
                    headers=req.headers,
                )  # fmt: skip
                break
            except httpx.TransportError as exc:
                await asyncio.sleep(self._cfg.retry_after_s(req, attempt, exc))
                attempt += 1
        raise_for(resp)
        return resp

    async def _json(self, req: Request) -> Any:
        return (await self.send(req)).json()

    # -- tasks -------------------------------------------------------------------------

    async def create_task(self, **fields: Unpack[TaskFields]) -> Task:
        """Schedule a task: run_at or delay; queue, payload, idempotency_key, retry,
        visibility_timeout_s, expires_at, window_s."""
        return cast(Task, await self._json(R.create_task(**fields)))

    async def create_tasks(self, tasks: list[dict[str, Any]]) -> list[BatchItem]:
        return cast(list[BatchItem], (await self._json(R.create_tasks(tasks)))["results"])

    async def get_task(self, task_id: str) -> Task:
        return cast(Task, await self._json(R.get_task(task_id)))

    async def update_task(
        self,
        task_id: str,
        *,
        run_at: datetime | str | None = None,
        delay: float | None = None,
        payload: Any = UNSET,
    ) -> Task:
        """Reschedule (run_at or delay) and/or replace the payload."""
        req = R.update_task(task_id, run_at=run_at, delay=delay, payload=payload)
        return cast(Task, await self._json(req))

    async def cancel_task(self, task_id: str) -> Task:
        return cast(Task, await self._json(R.cancel_task(task_id)))

    async def list_tasks(
        self,
        *,
        queue: str | None = None,
        state: State | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> TaskPage:
        """One page; a page may be short (even empty) while next_cursor is not None."""
        req = R.list_tasks(queue=queue, state=state, limit=limit, cursor=cursor)
        return cast(TaskPage, await self._json(req))

    async def iter_tasks(
        self, *, queue: str | None = None, state: State | None = None, page_size: int = 1000
    ) -> AsyncIterator[Task]:
        """Every task of the tenant (filtered), following next_cursor to its end."""
        cursor: str | None = None
        while True:
            page = await self.list_tasks(queue=queue, state=state, limit=page_size, cursor=cursor)
            for task in page["items"]:
                yield task
            cursor = page["next_cursor"]
            if cursor is None:
                return

    async def task_runs(self, task_id: str) -> RunHistory:
        return cast(RunHistory, await self._json(R.task_runs(task_id)))

    # -- dead letters ------------------------------------------------------------------

    async def list_dead_letters(
        self, *, limit: int | None = None, cursor: str | None = None
    ) -> DeadLetterPage:
        return cast(
            DeadLetterPage, await self._json(R.list_dead_letters(limit=limit, cursor=cursor))
        )

    async def replay_dead_letter(self, run_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], await self._json(R.replay_dead_letter(run_id)))

    async def purge_dead_letter(self, run_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], await self._json(R.purge_dead_letter(run_id)))

    # -- schedules ---------------------------------------------------------------------

    async def create_schedule(self, **fields: Unpack[ScheduleFields]) -> Schedule:
        """Create a recurring schedule: cron (+ timezone) or every_s."""
        return cast(Schedule, await self._json(R.create_schedule(**fields)))

    async def get_schedule(self, schedule_id: str) -> Schedule:
        return cast(Schedule, await self._json(R.get_schedule(schedule_id)))

    async def list_schedules(
        self, *, limit: int | None = None, cursor: str | None = None
    ) -> SchedulePage:
        """One page; a page may be short (even empty) while next_cursor is not None."""
        return cast(SchedulePage, await self._json(R.list_schedules(limit=limit, cursor=cursor)))

    async def update_schedule(self, schedule_id: str, **fields: Unpack[ScheduleFields]) -> Schedule:
        """Change the given fields of a schedule."""
        return cast(Schedule, await self._json(R.update_schedule(schedule_id, **fields)))

    async def delete_schedule(self, schedule_id: str) -> Schedule:
        return cast(Schedule, await self._json(R.schedule_action(schedule_id, "delete")))

    async def pause_schedule(self, schedule_id: str) -> Schedule:
        return cast(Schedule, await self._json(R.schedule_action(schedule_id, "pause")))

    async def resume_schedule(self, schedule_id: str) -> Schedule:
        return cast(Schedule, await self._json(R.schedule_action(schedule_id, "resume")))

    async def trigger_schedule(self, schedule_id: str) -> Schedule:
        return cast(Schedule, await self._json(R.schedule_action(schedule_id, "trigger")))

    async def backfill_schedule(
        self, schedule_id: str, *, start_at: datetime | str, end_at: datetime | str
    ) -> Schedule:
        req = R.backfill_schedule(schedule_id, start_at=start_at, end_at=end_at)
        return cast(Schedule, await self._json(req))

    async def schedule_runs(self, schedule_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], await self._json(R.schedule_runs(schedule_id)))

    # -- tenants (admin) ---------------------------------------------------------------

    async def create_tenant(self, tenant_id: str, **limits: Unpack[TenantLimits]) -> Tenant:
        return cast(Tenant, await self._json(R.create_tenant(tenant_id, **limits)))

    async def get_tenant(self, tenant_id: str) -> Tenant:
        return cast(Tenant, await self._json(R.get_tenant(tenant_id)))

    async def update_tenant(self, tenant_id: str, limits: Mapping[str, float | None]) -> Tenant:
        """Change some limits ({"dispatch_rate": 50}); None clears one."""
        return cast(Tenant, await self._json(R.update_tenant(tenant_id, limits)))

    async def create_key(self, tenant_id: str) -> ApiKey:
        return cast(ApiKey, await self._json(R.create_key(tenant_id)))

    async def revoke_key(self, tenant_id: str, key_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], await self._json(R.revoke_key(tenant_id, key_id)))

    # -- operations --------------------------------------------------------------------

    async def healthz(self) -> dict[str, Any]:
        return cast(dict[str, Any], await self._json(get("/healthz")))

    async def readyz(self) -> dict[str, Any]:
        return cast(dict[str, Any], await self._json(get("/readyz")))

    async def openapi(self) -> dict[str, Any]:
        return cast(dict[str, Any], await self._json(get("/openapi.json")))

    async def metrics(self) -> str:
        return (await self.send(get("/metrics"))).text
