"""The Python SDK of the HTTP API: `Client` (blocking) and `AsyncClient` (asyncio), on httpx.

    from timewheel.client import Client
    with Client("http://127.0.0.1:8080", key="tw_...") as tw:
        task = tw.create_task(delay=30, queue="emails", payload={"to": "a@b.c"})
        print(tw.get_task(task["id"])["state"])

Errors are the `ApiError` subclasses of timewheel.errors, one per status (NotFoundError,
ConflictError, RateLimitedError ...); an unreachable server is `TransportError`.
Connection errors are retried (3 times, backoff from 0.1 s) for idempotent calls only:
reads, and creates, which always carry an idempotency key (generated when the caller
gives none, so a create retried after a lost answer finds the task the first one made).
`url` and `key` default to TIMEWHEEL_URL and TIMEWHEEL_KEY.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, Self, TypedDict, cast

import httpx

from timewheel.errors import (
    ApiError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitedError,
    ServerError,
    TransportError,
    UnprocessableError,
)

DEFAULT_URL = "http://127.0.0.1:8080"
_UNSET: Any = object()
ERRORS: dict[int, type[ApiError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    422: UnprocessableError,
    429: RateLimitedError,
}

State = Literal["scheduled", "dispatched", "succeeded", "cancelled", "dead"]


class Task(TypedDict, total=False):
    id: str
    run_id: str
    queue: str
    state: State
    attempt: int
    run_at: str
    created_at: str
    updated_at: str | None
    payload: Any
    last_error: str | None
    schedule_id: str
    retry: dict[str, Any]
    visibility_timeout_s: float
    expires_at_ms: int
    window_s: float


class TaskPage(TypedDict):
    items: list[Task]
    next_cursor: str | None


class BatchItem(TypedDict, total=False):
    status: int
    task: Task
    error: dict[str, Any]


class RunEvent(TypedDict):
    event: str
    at: str
    attempt: int | None
    reason: str | None
    error: str | None


class RunHistory(TypedDict):
    run_id: str
    events: list[RunEvent]


class DeadLetter(TypedDict):
    run_id: str
    queue: str
    attempt: int
    reason: str
    error: str
    dead_at: str
    run_at: str
    payload: Any


class DeadLetterPage(TypedDict):
    items: list[DeadLetter]
    next_cursor: str | None


class Tenant(TypedDict):
    id: str
    limits: dict[str, Any]
    created_at_ms: int


class ApiKey(TypedDict):
    tenant: str
    key_id: str
    key: str


@dataclass(frozen=True)
class Request:
    """One API call, built once and sent by either client."""

    method: str
    path: str
    json: Any = None
    params: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    idempotent: bool = False


def _time(value: datetime | str) -> str:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("run_at/expires_at must be timezone-aware")
        return value.isoformat()
    return value


def _new_idempotency_key() -> str:
    return "sdk-" + secrets.token_hex(16)


def _drop_none(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def raise_for(resp: httpx.Response) -> None:
    """Raise the ApiError subclass for an error response."""
    if resp.status_code < 400:
        return
    try:
        err = resp.json()["error"]
        code, message, field_ = str(err["code"]), str(err["message"]), err.get("field")
    except (ValueError, KeyError, TypeError):
        code, message, field_ = "http_error", resp.text[:200] or resp.reason_phrase, None
    if resp.status_code == 429:
        after = resp.headers.get("retry-after")
        raise RateLimitedError(
            429, code, message, field_,
            retry_after_s=float(after) if after and after.isdigit() else None,
        )
    cls = ERRORS.get(resp.status_code, ServerError if resp.status_code >= 500 else ApiError)
    raise cls(resp.status_code, code, message, field_)


class _Requests:
    """Builders of every call; the clients send them."""

    @staticmethod
    def create_task(
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
    ) -> Request:
        body = _drop_none(
            {
                "run_at": None if run_at is None else _time(run_at),
                "delay": delay,
                "queue": queue,
                "retry": retry,
                "visibility_timeout_s": visibility_timeout_s,
                "expires_at": None if expires_at is None else _time(expires_at),
                "window_s": window_s,
            }
        )
        body["payload"] = payload
        key = idempotency_key or _new_idempotency_key()
        return Request("POST", "/v1/tasks", body, headers={"Idempotency-Key": key},
                       idempotent=True)

    @staticmethod
    def create_tasks(tasks: list[dict[str, Any]]) -> Request:
        items = [
            t if "idempotency_key" in t else {**t, "idempotency_key": _new_idempotency_key()}
            for t in tasks
        ]
        return Request("POST", "/v1/tasks/batch", {"tasks": items}, idempotent=True)

    @staticmethod
    def update_task(
        task_id: str,
        *,
        run_at: datetime | str | None = None,
        delay: float | None = None,
        payload: Any = _UNSET,
    ) -> Request:
        body = _drop_none({"run_at": None if run_at is None else _time(run_at), "delay": delay})
        if payload is not _UNSET:
            body["payload"] = payload
        return Request("PATCH", f"/v1/tasks/{task_id}", body)

    @staticmethod
    def list_tasks(
        *,
        queue: str | None = None,
        state: State | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Request:
        params = _drop_none({"queue": queue, "state": state, "limit": limit, "cursor": cursor})
        return Request("GET", "/v1/tasks", params=params, idempotent=True)

    @staticmethod
    def list_dead_letters(*, limit: int | None = None, cursor: str | None = None) -> Request:
        params = _drop_none({"limit": limit, "cursor": cursor})
        return Request("GET", "/v1/dead-letters", params=params, idempotent=True)

    @staticmethod
    def create_tenant(
        tenant_id: str,
        *,
        max_payload_bytes: int | None = None,
        max_pending: int | None = None,
        dispatch_rate: float | None = None,
    ) -> Request:
        limits = _drop_none(
            {
                "max_payload_bytes": max_payload_bytes,
                "max_pending": max_pending,
                "dispatch_rate": dispatch_rate,
            }
        )
        return Request("POST", "/v1/tenants", {"id": tenant_id, "limits": limits})


def _get(path: str) -> Request:
    return Request("GET", path, idempotent=True)


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
        self._cfg = _Config(url, key, timeout_s, retries)
        self._http = httpx.Client(
            base_url=self._cfg.url, headers=self._cfg.headers(), timeout=timeout_s,
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
                    req.method, req.path, json=req.json if req.json is not None else None,
                    params=req.params or None, headers=req.headers,
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
        req = _Requests.create_task(
            run_at=run_at, delay=delay, queue=queue, payload=payload,
            idempotency_key=idempotency_key, retry=retry,
            visibility_timeout_s=visibility_timeout_s, expires_at=expires_at, window_s=window_s,
        )
        return cast(Task, self._json(req))

    def create_tasks(self, tasks: list[dict[str, Any]]) -> list[BatchItem]:
        return cast(list[BatchItem], self._json(_Requests.create_tasks(tasks))["results"])

    def get_task(self, task_id: str) -> Task:
        return cast(Task, self._json(_get(f"/v1/tasks/{task_id}")))

    def update_task(
        self,
        task_id: str,
        *,
        run_at: datetime | str | None = None,
        delay: float | None = None,
        payload: Any = _UNSET,
    ) -> Task:
        """Reschedule (run_at or delay) and/or replace the payload."""
        req = _Requests.update_task(task_id, run_at=run_at, delay=delay, payload=payload)
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
        req = _Requests.list_tasks(queue=queue, state=state, limit=limit, cursor=cursor)
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
        return cast(RunHistory, self._json(_get(f"/v1/tasks/{task_id}/runs")))

    # dead letters
    def list_dead_letters(
        self, *, limit: int | None = None, cursor: str | None = None
    ) -> DeadLetterPage:
        req = _Requests.list_dead_letters(limit=limit, cursor=cursor)
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
        req = _Requests.create_tenant(
            tenant_id, max_payload_bytes=max_payload_bytes, max_pending=max_pending,
            dispatch_rate=dispatch_rate,
        )
        return cast(Tenant, self._json(req))

    def get_tenant(self, tenant_id: str) -> Tenant:
        return cast(Tenant, self._json(_get(f"/v1/tenants/{tenant_id}")))

    def create_key(self, tenant_id: str) -> ApiKey:
        return cast(ApiKey, self._json(Request("POST", f"/v1/tenants/{tenant_id}/keys")))

    def revoke_key(self, tenant_id: str, key_id: str) -> dict[str, Any]:
        req = Request("DELETE", f"/v1/tenants/{tenant_id}/keys/{key_id}")
        return cast(dict[str, Any], self._json(req))

    # operations
    def healthz(self) -> dict[str, Any]:
        return cast(dict[str, Any], self._json(_get("/healthz")))

    def readyz(self) -> dict[str, Any]:
        return cast(dict[str, Any], self._json(_get("/readyz")))

    def openapi(self) -> dict[str, Any]:
        return cast(dict[str, Any], self._json(_get("/openapi.json")))

    def metrics(self) -> str:
        return self.send(_get("/metrics")).text


class AsyncClient:
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
            base_url=self._cfg.url, headers=self._cfg.headers(), timeout=timeout_s,
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
                    req.method, req.path, json=req.json if req.json is not None else None,
                    params=req.params or None, headers=req.headers,
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
        req = _Requests.create_task(
            run_at=run_at, delay=delay, queue=queue, payload=payload,
            idempotency_key=idempotency_key, retry=retry,
            visibility_timeout_s=visibility_timeout_s, expires_at=expires_at, window_s=window_s,
        )
        return cast(Task, await self._json(req))

    async def create_tasks(self, tasks: list[dict[str, Any]]) -> list[BatchItem]:
        return cast(list[BatchItem], (await self._json(_Requests.create_tasks(tasks)))["results"])

    async def get_task(self, task_id: str) -> Task:
        return cast(Task, await self._json(_get(f"/v1/tasks/{task_id}")))

    async def update_task(
        self,
        task_id: str,
        *,
        run_at: datetime | str | None = None,
        delay: float | None = None,
        payload: Any = _UNSET,
    ) -> Task:
        """Reschedule (run_at or delay) and/or replace the payload."""
        req = _Requests.update_task(task_id, run_at=run_at, delay=delay, payload=payload)
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
        req = _Requests.list_tasks(queue=queue, state=state, limit=limit, cursor=cursor)
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
        return cast(RunHistory, await self._json(_get(f"/v1/tasks/{task_id}/runs")))

    # dead letters
    async def list_dead_letters(
        self, *, limit: int | None = None, cursor: str | None = None
    ) -> DeadLetterPage:
        req = _Requests.list_dead_letters(limit=limit, cursor=cursor)
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
        req = _Requests.create_tenant(
            tenant_id, max_payload_bytes=max_payload_bytes, max_pending=max_pending,
            dispatch_rate=dispatch_rate,
        )
        return cast(Tenant, await self._json(req))

    async def get_tenant(self, tenant_id: str) -> Tenant:
        return cast(Tenant, await self._json(_get(f"/v1/tenants/{tenant_id}")))

    async def create_key(self, tenant_id: str) -> ApiKey:
        return cast(ApiKey, await self._json(Request("POST", f"/v1/tenants/{tenant_id}/keys")))

    async def revoke_key(self, tenant_id: str, key_id: str) -> dict[str, Any]:
        req = Request("DELETE", f"/v1/tenants/{tenant_id}/keys/{key_id}")
        return cast(dict[str, Any], await self._json(req))

    # operations
    async def healthz(self) -> dict[str, Any]:
        return cast(dict[str, Any], await self._json(_get("/healthz")))

    async def readyz(self) -> dict[str, Any]:
        return cast(dict[str, Any], await self._json(_get("/readyz")))

    async def openapi(self) -> dict[str, Any]:
        return cast(dict[str, Any], await self._json(_get("/openapi.json")))

    async def metrics(self) -> str:
        return (await self.send(_get("/metrics"))).text
