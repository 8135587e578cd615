"""The Python SDK of the HTTP API: `Client` (blocking) and `AsyncClient` (asyncio), on httpx.

    from timewheel.sdk.client import Client
    with Client("http://127.0.0.1:8080", key="tw_...") as tw:
        task = tw.create_task(delay=30, queue="emails", payload={"to": "a@b.c"})
        print(tw.get_task(task["id"])["state"])

Errors are the `ApiError` subclasses of timewheel.errors, one per status (NotFoundError,
ConflictError, RateLimitedError ...); an unreachable server is `TransportError`.
Connection errors are retried (3 times, backoff from 0.1 s) for idempotent calls only:
reads, and creates, which always carry an idempotency key (generated when the caller
gives none, so a create retried after a lost answer finds the task the first one made).
`url` and `key` default to TIMEWHEEL_URL and TIMEWHEEL_KEY. Request builders and the
response types are in timewheel/calls.py; schedule methods in timewheel/schedule_client.py.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from datetime import datetime
from types import TracebackType
from typing import Any, Self, cast

import httpx

from timewheel.sdk.errors import TransportError
from timewheel.sdk.requests import (
    UNSET,
    ApiKey,
    BatchItem,
    DeadLetter,
    DeadLetterPage,
    Request,
    Requests,
    RunEvent,
    RunHistory,
    State,
    Task,
    TaskPage,
    Tenant,
    get,
    raise_for,
)
from timewheel.sdk.schedules import AsyncScheduleMethods, ScheduleMethods

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

DEFAULT_URL = "http://127.0.0.1:8080"


class _Config:
    def __init__(
        self,
        url: str | None,
        key: str | None,
        timeout_s: float,
        retries: int,
    ):
        self.url = (url or os.environ.get("TIMEWHEEL_URL") or DEFAULT_URL).rstrip("/")
        self.key = key if key is not None else os.environ.get("TIMEWHEEL_KEY", "")
        self.timeout_s = timeout_s
        self.retries = retries

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}


def _backoff_s(attempt: int) -> float:
    return float(0.1 * 2**attempt)


class Client(ScheduleMethods):
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
        self._cfg = _Config(url, key, timeout_s, retries)
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
                    req.method,
                    req.path,
                    json=req.json if req.json is not None else None,
                    params=req.params or None,
                    headers=req.headers,
                )
                break
            except httpx.TransportError as exc:
                if not req.idempotent or attempt >= self._cfg.retries:
                    raise TransportError(f"{req.method} {self._cfg.url}{req.path}: {exc}") from exc
                time.sleep(_backoff_s(attempt))
                attempt += 1
        raise_for(resp)
        return resp

    def _json(self, req: Request) -> Any:
        return self.send(req).json()

    # tasks
    def create_task(
        self,
        *,
        run_at: datetime | str | None = None,
        delay: float | None = None,
        queue: str | None = None,
        payload: Any = None,
        idempotency_key: str | None = None,
        retry: dict[str, Any] | None = None,
        visibility_timeout_s: float | None = None,
        expires_at: datetime | str | None = None,
        window_s: float | None = None,
    ) -> Task:
        """Schedule a task: run_at or delay; queue, payload, idempotency_key, retry,
        visibility_timeout_s, expires_at, window_s (DESIGN.md section 11)."""
        req = Requests.create_task(
            run_at=run_at,
            delay=delay,
            queue=queue,
            payload=payload,
            idempotency_key=idempotency_key,
            retry=retry,
            visibility_timeout_s=visibility_timeout_s,
            expires_at=expires_at,
            window_s=window_s,
        )
        return cast(Task, self._json(req))

    def create_tasks(self, tasks: list[dict[str, Any]]) -> list[BatchItem]:
        return cast(list[BatchItem], self._json(Requests.create_tasks(tasks))["results"])

    def get_task(self, task_id: str) -> Task:
        return cast(Task, self._json(get(f"/v1/tasks/{task_id}")))

    def update_task(
        self,
        task_id: str,
        *,
        run_at: datetime | str | None = None,
        delay: float | None = None,
        payload: Any = UNSET,
    ) -> Task:
        """Reschedule (run_at or delay) and/or replace the payload."""
        req = Requests.update_task(task_id, run_at=run_at, delay=delay, payload=payload)
        return cast(Task, self._json(req))

    def cancel_task(self, task_id: str) -> Task:
        return cast(Task, self._json(Request("DELETE", f"/v1/tasks/{task_id}")))

    def list_tasks(
        self,
        *,
        queue: str | None = None,
        state: State | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> TaskPage:
        """One page; a page may be short (even empty) while next_cursor is not None."""
        req = Requests.list_tasks(queue=queue, state=state, limit=limit, cursor=cursor)
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
        return cast(RunHistory, self._json(get(f"/v1/tasks/{task_id}/runs")))

    # dead letters
    def list_dead_letters(
        self, *, limit: int | None = None, cursor: str | None = None
    ) -> DeadLetterPage:
        req = Requests.list_dead_letters(limit=limit, cursor=cursor)
        return cast(DeadLetterPage, self._json(req))

    def replay_dead_letter(self, run_id: str) -> dict[str, Any]:
        req = Request("POST", f"/v1/dead-letters/{run_id}/replay")
        return cast(dict[str, Any], self._json(req))

    def purge_dead_letter(self, run_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], self._json(Request("DELETE", f"/v1/dead-letters/{run_id}")))

    # admin
    def create_tenant(
        self,
        tenant_id: str,
        *,
        max_payload_bytes: int | None = None,
        max_pending: int | None = None,
        dispatch_rate: float | None = None,
    ) -> Tenant:
        req = Requests.create_tenant(
            tenant_id,
            max_payload_bytes=max_payload_bytes,
            max_pending=max_pending,
            dispatch_rate=dispatch_rate,
        )
        return cast(Tenant, self._json(req))

    def get_tenant(self, tenant_id: str) -> Tenant:
        return cast(Tenant, self._json(get(f"/v1/tenants/{tenant_id}")))

    def update_tenant(self, tenant_id: str, limits: Mapping[str, float | None]) -> Tenant:
        """Change some limits ({"dispatch_rate": 50}); None clears one."""
        return cast(Tenant, self._json(Requests.update_tenant(tenant_id, limits)))

    def create_key(self, tenant_id: str) -> ApiKey:
        return cast(ApiKey, self._json(Request("POST", f"/v1/tenants/{tenant_id}/keys")))

    def revoke_key(self, tenant_id: str, key_id: str) -> dict[str, Any]:
        req = Request("DELETE", f"/v1/tenants/{tenant_id}/keys/{key_id}")
        return cast(dict[str, Any], self._json(req))

    # operations
    def healthz(self) -> dict[str, Any]:
        return cast(dict[str, Any], self._json(get("/healthz")))

    def readyz(self) -> dict[str, Any]:
        return cast(dict[str, Any], self._json(get("/readyz")))

    def openapi(self) -> dict[str, Any]:
        return cast(dict[str, Any], self._json(get("/openapi.json")))

    def metrics(self) -> str:
        return self.send(get("/metrics")).text


class AsyncClient(AsyncScheduleMethods):
    """asyncio client of the HTTP API; the same methods as Client, awaited."""

    def __init__(
        self,
        url: str | None = None,
        key: str | None = None,
        *,
        timeout_s: float = 10.0,
        retries: int = 3,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        self._cfg = _Config(url, key, timeout_s, retries)
        self._http = httpx.AsyncClient(
            base_url=self._cfg.url,
            headers=self._cfg.headers(),
            timeout=timeout_s,
            transport=transport,
        )

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
                    req.method,
                    req.path,
                    json=req.json if req.json is not None else None,
                    params=req.params or None,
                    headers=req.headers,
                )
                break
            except httpx.TransportError as exc:
                if not req.idempotent or attempt >= self._cfg.retries:
                    raise TransportError(f"{req.method} {self._cfg.url}{req.path}: {exc}") from exc
                await asyncio.sleep(_backoff_s(attempt))
                attempt += 1
        raise_for(resp)
        return resp

    async def _json(self, req: Request) -> Any:
        return (await self.send(req)).json()

    # tasks
    async def create_task(
        self,
        *,
        run_at: datetime | str | None = None,
        delay: float | None = None,
        queue: str | None = None,
        payload: Any = None,
        idempotency_key: str | None = None,
        retry: dict[str, Any] | None = None,
        visibility_timeout_s: float | None = None,
        expires_at: datetime | str | None = None,
        window_s: float | None = None,
    ) -> Task:
        """See Client.create_task."""
        req = Requests.create_task(
            run_at=run_at,
            delay=delay,
            queue=queue,
            payload=payload,
            idempotency_key=idempotency_key,
            retry=retry,
            visibility_timeout_s=visibility_timeout_s,
            expires_at=expires_at,
            window_s=window_s,
        )
        return cast(Task, await self._json(req))

    async def create_tasks(self, tasks: list[dict[str, Any]]) -> list[BatchItem]:
        return cast(list[BatchItem], (await self._json(Requests.create_tasks(tasks)))["results"])

    async def get_task(self, task_id: str) -> Task:
        return cast(Task, await self._json(get(f"/v1/tasks/{task_id}")))

    async def update_task(
        self,
        task_id: str,
        *,
        run_at: datetime | str | None = None,
        delay: float | None = None,
        payload: Any = UNSET,
    ) -> Task:
        """Reschedule (run_at or delay) and/or replace the payload."""
        req = Requests.update_task(task_id, run_at=run_at, delay=delay, payload=payload)
        return cast(Task, await self._json(req))

    async def cancel_task(self, task_id: str) -> Task:
        return cast(Task, await self._json(Request("DELETE", f"/v1/tasks/{task_id}")))

    async def list_tasks(
        self,
        *,
        queue: str | None = None,
        state: State | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> TaskPage:
        """One page; a page may be short (even empty) while next_cursor is not None."""
        req = Requests.list_tasks(queue=queue, state=state, limit=limit, cursor=cursor)
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
        return cast(RunHistory, await self._json(get(f"/v1/tasks/{task_id}/runs")))

    # dead letters
    async def list_dead_letters(
        self, *, limit: int | None = None, cursor: str | None = None
    ) -> DeadLetterPage:
        req = Requests.list_dead_letters(limit=limit, cursor=cursor)
        return cast(DeadLetterPage, await self._json(req))

    async def replay_dead_letter(self, run_id: str) -> dict[str, Any]:
        req = Request("POST", f"/v1/dead-letters/{run_id}/replay")
        return cast(dict[str, Any], await self._json(req))

    async def purge_dead_letter(self, run_id: str) -> dict[str, Any]:
        req = Request("DELETE", f"/v1/dead-letters/{run_id}")
        return cast(dict[str, Any], await self._json(req))

    # admin
    async def create_tenant(
        self,
        tenant_id: str,
        *,
        max_payload_bytes: int | None = None,
        max_pending: int | None = None,
        dispatch_rate: float | None = None,
    ) -> Tenant:
        req = Requests.create_tenant(
            tenant_id,
            max_payload_bytes=max_payload_bytes,
            max_pending=max_pending,
            dispatch_rate=dispatch_rate,
        )
        return cast(Tenant, await self._json(req))

    async def get_tenant(self, tenant_id: str) -> Tenant:
        return cast(Tenant, await self._json(get(f"/v1/tenants/{tenant_id}")))

    async def update_tenant(self, tenant_id: str, limits: Mapping[str, float | None]) -> Tenant:
        """Change some limits ({"dispatch_rate": 50}); None clears one."""
        return cast(Tenant, await self._json(Requests.update_tenant(tenant_id, limits)))

    async def create_key(self, tenant_id: str) -> ApiKey:
        return cast(ApiKey, await self._json(Request("POST", f"/v1/tenants/{tenant_id}/keys")))

    async def revoke_key(self, tenant_id: str, key_id: str) -> dict[str, Any]:
        req = Request("DELETE", f"/v1/tenants/{tenant_id}/keys/{key_id}")
        return cast(dict[str, Any], await self._json(req))

    # operations
    async def healthz(self) -> dict[str, Any]:
        return cast(dict[str, Any], await self._json(get("/healthz")))

    async def readyz(self) -> dict[str, Any]:
        return cast(dict[str, Any], await self._json(get("/readyz")))

    async def openapi(self) -> dict[str, Any]:
        return cast(dict[str, Any], await self._json(get("/openapi.json")))

    async def metrics(self) -> str:
        return (await self.send(get("/metrics"))).text
