"""Request builders and response types of the HTTP API, shared by Client and AsyncClient:
each builder returns a `Request` that either client sends, so the two clients differ only
in how they send it."""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, NotRequired, TypedDict, Unpack

import httpx

from timewheel.sdk.errors import (
    ApiError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitedError,
    ServerError,
    StorageFullError,
    TransportError,
    UnprocessableError,
)
from timewheel.types import StateName

UNSET: Any = object()
"""Marks an argument the caller did not give (where None is a value, e.g. a payload)."""
ERRORS: dict[int, type[ApiError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    422: UnprocessableError,
    429: RateLimitedError,
    507: StorageFullError,
}

State = StateName


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
    shards: NotRequired[list[int]]
    """The shards the tenant's new tasks go to."""
    shards_used: NotRequired[list[int]]
    """Every shard that may hold the tenant's tasks."""


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


def time_arg(value: datetime | str) -> str:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("run_at/expires_at must be timezone-aware")
        return value.isoformat()
    return value


def new_idempotency_key() -> str:
    return "sdk-" + secrets.token_hex(16)


def drop_none(values: dict[str, Any]) -> dict[str, Any]:
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
            429,
            code,
            message,
            field_,
            retry_after_s=float(after) if after and after.isdigit() else None,
        )
    cls = ERRORS.get(resp.status_code, ServerError if resp.status_code >= 500 else ApiError)
    raise cls(resp.status_code, code, message, field_)


class TaskFields(TypedDict, total=False):
    """The fields of a task create (docs/reference/http.md, createTask); None leaves one out."""

    run_at: datetime | str | None
    delay: float | None
    queue: str | None
    payload: Any
    idempotency_key: str | None
    retry: dict[str, Any] | None
    visibility_timeout_s: float | None
    expires_at: datetime | str | None
    window_s: float | None


class ScheduleFields(TypedDict, total=False):
    """The fields of a schedule create or update: cron (+ timezone) or every_s; None
    leaves one out."""

    cron: str | None
    timezone: str | None
    every_s: float | None
    queue: str | None
    payload: Any
    start_at: datetime | str | None
    end_at: datetime | str | None
    max_runs: int | None
    retry: dict[str, Any] | None
    catchup: Literal["skip", "latest", "all"] | None
    catchup_window_s: float | None
    jitter_s: float | None
    overlap: Literal["allow", "skip", "buffer_one"] | None
    paused: bool | None


class TenantLimits(TypedDict, total=False):
    """A tenant's limits; None (in an update) clears one."""

    max_payload_bytes: int | None
    max_pending: int | None
    dispatch_rate: float | None
    max_payload_total_bytes: int | None
    max_schedules: int | None
    max_queues: int | None
    min_interval_s: float | None
    max_backlog: int | None
    shards: int | None


Schedule = dict[str, Any]
"""A schedule as the API returns it (id, state, next_run_at ...)."""
SchedulePage = dict[str, Any]
"""{"items": [Schedule, ...], "next_cursor": str | None}."""

_TIMES = ("run_at", "expires_at", "start_at", "end_at")


def _body(fields: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON body of the given fields: None ones left out, times as RFC 3339."""
    return {k: time_arg(v) if k in _TIMES else v for k, v in fields.items() if v is not None}


def _schedule(schedule_id: str, action: str = "") -> str:
    return f"/v1/schedules/{schedule_id}" + (f"/{action}" if action else "")


class Requests:
    """Builders of every call; the clients send them."""

    # -- tasks -------------------------------------------------------------------------

    @staticmethod
    def create_task(**fields: Unpack[TaskFields]) -> Request:
        body = _body({k: v for k, v in fields.items() if k != "idempotency_key"})
        body["payload"] = fields.get("payload")
        key = fields.get("idempotency_key") or new_idempotency_key()
        return Request("POST", "/v1/tasks", body, headers={"Idempotency-Key": key}, idempotent=True)

    @staticmethod
    def create_tasks(tasks: list[dict[str, Any]]) -> Request:
        items = [
            t if "idempotency_key" in t else {**t, "idempotency_key": new_idempotency_key()}
            for t in tasks
        ]
        return Request("POST", "/v1/tasks/batch", {"tasks": items}, idempotent=True)

    @staticmethod
    def get_task(task_id: str) -> Request:
        return get(f"/v1/tasks/{task_id}")

    @staticmethod
    def update_task(
        task_id: str,
        *,
        run_at: datetime | str | None = None,
        delay: float | None = None,
        payload: Any = UNSET,
    ) -> Request:
        body = _body({"run_at": run_at, "delay": delay})
        if payload is not UNSET:
            body["payload"] = payload
        return Request("PATCH", f"/v1/tasks/{task_id}", body)

    @staticmethod
    def cancel_task(task_id: str) -> Request:
        return Request("DELETE", f"/v1/tasks/{task_id}")

    @staticmethod
    def list_tasks(
        *,
        queue: str | None = None,
        state: State | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Request:
        params = drop_none({"queue": queue, "state": state, "limit": limit, "cursor": cursor})
        return Request("GET", "/v1/tasks", params=params, idempotent=True)

    @staticmethod
    def task_runs(task_id: str) -> Request:
        return get(f"/v1/tasks/{task_id}/runs")

    # -- dead letters ------------------------------------------------------------------

    @staticmethod
    def list_dead_letters(*, limit: int | None = None, cursor: str | None = None) -> Request:
        params = drop_none({"limit": limit, "cursor": cursor})
        return Request("GET", "/v1/dead-letters", params=params, idempotent=True)

    @staticmethod
    def replay_dead_letter(run_id: str) -> Request:
        return Request("POST", f"/v1/dead-letters/{run_id}/replay")

    @staticmethod
    def purge_dead_letter(run_id: str) -> Request:
        return Request("DELETE", f"/v1/dead-letters/{run_id}")

    # -- schedules ---------------------------------------------------------------------

    @staticmethod
    def create_schedule(**fields: Unpack[ScheduleFields]) -> Request:
        return Request("POST", "/v1/schedules", _body(fields))

    @staticmethod
    def get_schedule(schedule_id: str) -> Request:
        return get(_schedule(schedule_id))

    @staticmethod
    def list_schedules(*, limit: int | None = None, cursor: str | None = None) -> Request:
        params = drop_none({"limit": limit, "cursor": cursor})
        return Request("GET", "/v1/schedules", params=params, idempotent=True)

    @staticmethod
    def update_schedule(schedule_id: str, **fields: Unpack[ScheduleFields]) -> Request:
        return Request("PATCH", _schedule(schedule_id), _body(fields))

    @staticmethod
    def schedule_action(schedule_id: str, action: str) -> Request:
        """DELETE the schedule (action 'delete'), or POST .../pause, resume or trigger."""
        if action == "delete":
            return Request("DELETE", _schedule(schedule_id))
        return Request("POST", _schedule(schedule_id, action))

    @staticmethod
    def backfill_schedule(
        schedule_id: str, *, start_at: datetime | str, end_at: datetime | str
    ) -> Request:
        """Every fire time in [start_at, end_at], sent at once, oldest first."""
        body = {"from": time_arg(start_at), "to": time_arg(end_at)}
        return Request("POST", _schedule(schedule_id, "backfill"), body)

    @staticmethod
    def schedule_runs(schedule_id: str) -> Request:
        return get(_schedule(schedule_id, "runs"))

    # -- tenants (admin) ---------------------------------------------------------------

    @staticmethod
    def create_tenant(tenant_id: str, **limits: Unpack[TenantLimits]) -> Request:
        return Request("POST", "/v1/tenants", {"id": tenant_id, "limits": drop_none(dict(limits))})

    @staticmethod
    def get_tenant(tenant_id: str) -> Request:
        return get(f"/v1/tenants/{tenant_id}")

    @staticmethod
    def update_tenant(tenant_id: str, limits: Mapping[str, float | None]) -> Request:
        """Set the given limits; a None value clears one. Setting is idempotent."""
        body = {"limits": dict(limits)}
        return Request("PATCH", f"/v1/tenants/{tenant_id}", body, idempotent=True)

    @staticmethod
    def create_key(tenant_id: str) -> Request:
        return Request("POST", f"/v1/tenants/{tenant_id}/keys")

    @staticmethod
    def revoke_key(tenant_id: str, key_id: str) -> Request:
        return Request("DELETE", f"/v1/tenants/{tenant_id}/keys/{key_id}")


def get(path: str) -> Request:
    return Request("GET", path, idempotent=True)


DEFAULT_URL = "http://127.0.0.1:8080"


class ClientConfig:
    """Where a client sends and how it retries: `url` and `key` default to TIMEWHEEL_URL
    and TIMEWHEEL_KEY; an idempotent call is retried `retries` times on a connection
    error, with backoff from 0.1 s."""

    def __init__(self, url: str | None, key: str | None, timeout_s: float, retries: int):
        self.url = (url or os.environ.get("TIMEWHEEL_URL") or DEFAULT_URL).rstrip("/")
        self.key = key if key is not None else os.environ.get("TIMEWHEEL_KEY", "")
        self.timeout_s = timeout_s
        self.retries = retries

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    def retry_after_s(self, req: Request, attempt: int, exc: Exception) -> float:
        """The backoff before retrying `req` after a connection error, or TransportError
        when it may not be retried (not idempotent, or out of retries)."""
        if not req.idempotent or attempt >= self.retries:
            raise TransportError(f"{req.method} {self.url}{req.path}: {exc}") from exc
        return float(0.1 * 2**attempt)
