"""Request builders and response types of the HTTP API, shared by Client and AsyncClient
(timewheel/client.py): each builder returns a `Request` that either client sends."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypedDict

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


class Requests:
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
        body = drop_none(
            {
                "run_at": None if run_at is None else time_arg(run_at),
                "delay": delay,
                "queue": queue,
                "retry": retry,
                "visibility_timeout_s": visibility_timeout_s,
                "expires_at": None if expires_at is None else time_arg(expires_at),
                "window_s": window_s,
            }
        )
        body["payload"] = payload
        key = idempotency_key or new_idempotency_key()
        return Request("POST", "/v1/tasks", body, headers={"Idempotency-Key": key}, idempotent=True)

    @staticmethod
    def create_tasks(tasks: list[dict[str, Any]]) -> Request:
        items = [
            t if "idempotency_key" in t else {**t, "idempotency_key": new_idempotency_key()}
            for t in tasks
        ]
        return Request("POST", "/v1/tasks/batch", {"tasks": items}, idempotent=True)

    @staticmethod
    def update_task(
        task_id: str,
        *,
        run_at: datetime | str | None = None,
        delay: float | None = None,
        payload: Any = UNSET,
    ) -> Request:
        body = drop_none({"run_at": None if run_at is None else time_arg(run_at), "delay": delay})
        if payload is not UNSET:
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
        params = drop_none({"queue": queue, "state": state, "limit": limit, "cursor": cursor})
        return Request("GET", "/v1/tasks", params=params, idempotent=True)

    @staticmethod
    def list_dead_letters(*, limit: int | None = None, cursor: str | None = None) -> Request:
        params = drop_none({"limit": limit, "cursor": cursor})
        return Request("GET", "/v1/dead-letters", params=params, idempotent=True)

    @staticmethod
    def create_tenant(
        tenant_id: str,
        *,
        max_payload_bytes: int | None = None,
        max_pending: int | None = None,
        dispatch_rate: float | None = None,
    ) -> Request:
        limits = drop_none(
            {
                "max_payload_bytes": max_payload_bytes,
                "max_pending": max_pending,
                "dispatch_rate": dispatch_rate,
            }
        )
        return Request("POST", "/v1/tenants", {"id": tenant_id, "limits": limits})

    @staticmethod
    def update_tenant(tenant_id: str, limits: Mapping[str, float | None]) -> Request:
        """Set the given limits; a None value clears one. Setting is idempotent."""
        body = {"limits": dict(limits)}
        return Request("PATCH", f"/v1/tenants/{tenant_id}", body, idempotent=True)


def get(path: str) -> Request:
    return Request("GET", path, idempotent=True)
