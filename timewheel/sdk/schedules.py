"""Schedule methods of the SDK, against the URL contract of the schedules API (issue 5):
POST /v1/schedules, GET /v1/schedules, GET/PATCH/DELETE /v1/schedules/{id},
POST /v1/schedules/{id}/pause|resume|trigger|backfill, GET /v1/schedules/{id}/runs.

Mixed into Client and AsyncClient; the server side is timewheel/api/schedule_routes.py.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, cast

from timewheel.sdk.requests import Request, drop_none, get, time_arg

Schedule = dict[str, Any]
"""A schedule as the API returns it (id, state, next_run_at ...: api/schedule_schemas.py)."""
SchedulePage = dict[str, Any]
"""{"items": [Schedule, ...], "next_cursor": str | None}."""
Catchup = Literal["skip", "latest", "all"]
Overlap = Literal["allow", "skip", "buffer_one"]


def schedule_body(
    *,
    cron: str | None = None,
    timezone: str | None = None,
    every_s: float | None = None,
    queue: str | None = None,
    payload: Any = None,
    start_at: datetime | str | None = None,
    end_at: datetime | str | None = None,
    max_runs: int | None = None,
    retry: dict[str, Any] | None = None,
    catchup: Catchup | None = None,
    catchup_window_s: float | None = None,
    jitter_s: float | None = None,
    overlap: Overlap | None = None,
    paused: bool | None = None,
) -> dict[str, Any]:
    """The JSON body of a schedule create or update; None fields are left out."""
    return drop_none(
        {
            "cron": cron,
            "timezone": timezone,
            "every_s": every_s,
            "queue": queue,
            "payload": payload,
            "start_at": None if start_at is None else time_arg(start_at),
            "end_at": None if end_at is None else time_arg(end_at),
            "max_runs": max_runs,
            "retry": retry,
            "catchup": catchup,
            "catchup_window_s": catchup_window_s,
            "jitter_s": jitter_s,
            "overlap": overlap,
            "paused": paused,
        }
    )


def _path(schedule_id: str, action: str = "") -> str:
    return f"/v1/schedules/{schedule_id}" + (f"/{action}" if action else "")


def _list(limit: int | None, cursor: str | None) -> Request:
    params = drop_none({"limit": limit, "cursor": cursor})
    return Request("GET", "/v1/schedules", params=params, idempotent=True)


def backfill_body(start_at: datetime | str, end_at: datetime | str) -> dict[str, Any]:
    """The backfill body: every fire time in [from, to] (api/schedule_schemas.BACKFILL)."""
    return {"from": time_arg(start_at), "to": time_arg(end_at)}


class ScheduleMethods:
    """Blocking schedule methods (Client)."""

    def _json(self, req: Request) -> Any:
        raise NotImplementedError

    def create_schedule(
        self,
        *,
        cron: str | None = None,
        timezone: str | None = None,
        every_s: float | None = None,
        queue: str | None = None,
        payload: Any = None,
        start_at: datetime | str | None = None,
        end_at: datetime | str | None = None,
        max_runs: int | None = None,
        retry: dict[str, Any] | None = None,
        catchup: Catchup | None = None,
        catchup_window_s: float | None = None,
        jitter_s: float | None = None,
        overlap: Overlap | None = None,
        paused: bool | None = None,
    ) -> Schedule:
        """Create a recurring schedule: cron (+ timezone) or every_s."""
        body = schedule_body(
            cron=cron,
            timezone=timezone,
            every_s=every_s,
            queue=queue,
            payload=payload,
            start_at=start_at,
            end_at=end_at,
            max_runs=max_runs,
            retry=retry,
            catchup=catchup,
            catchup_window_s=catchup_window_s,
            jitter_s=jitter_s,
            overlap=overlap,
            paused=paused,
        )
        return cast(Schedule, self._json(Request("POST", "/v1/schedules", body)))

    def get_schedule(self, schedule_id: str) -> Schedule:
        return cast(Schedule, self._json(get(_path(schedule_id))))

    def list_schedules(
        self, *, limit: int | None = None, cursor: str | None = None
    ) -> SchedulePage:
        """One page; a page may be short (even empty) while next_cursor is not None."""
        return cast(SchedulePage, self._json(_list(limit, cursor)))

    def update_schedule(
        self,
        schedule_id: str,
        *,
        cron: str | None = None,
        timezone: str | None = None,
        every_s: float | None = None,
        queue: str | None = None,
        payload: Any = None,
        start_at: datetime | str | None = None,
        end_at: datetime | str | None = None,
        max_runs: int | None = None,
        retry: dict[str, Any] | None = None,
        catchup: Catchup | None = None,
        catchup_window_s: float | None = None,
        jitter_s: float | None = None,
        overlap: Overlap | None = None,
        paused: bool | None = None,
    ) -> Schedule:
        """Change the given fields of a schedule."""
        body = schedule_body(
            cron=cron,
            timezone=timezone,
            every_s=every_s,
            queue=queue,
            payload=payload,
            start_at=start_at,
            end_at=end_at,
            max_runs=max_runs,
            retry=retry,
            catchup=catchup,
            catchup_window_s=catchup_window_s,
            jitter_s=jitter_s,
            overlap=overlap,
            paused=paused,
        )
        return cast(Schedule, self._json(Request("PATCH", _path(schedule_id), body)))

    def delete_schedule(self, schedule_id: str) -> Schedule:
        return cast(Schedule, self._json(Request("DELETE", _path(schedule_id))))

    def pause_schedule(self, schedule_id: str) -> Schedule:
        return cast(Schedule, self._json(Request("POST", _path(schedule_id, "pause"))))

    def resume_schedule(self, schedule_id: str) -> Schedule:
        return cast(Schedule, self._json(Request("POST", _path(schedule_id, "resume"))))

    def trigger_schedule(self, schedule_id: str) -> Schedule:
        return cast(Schedule, self._json(Request("POST", _path(schedule_id, "trigger"))))

    def backfill_schedule(
        self, schedule_id: str, *, start_at: datetime | str, end_at: datetime | str
    ) -> Schedule:
        req = Request("POST", _path(schedule_id, "backfill"), backfill_body(start_at, end_at))
        return cast(Schedule, self._json(req))

    def schedule_runs(self, schedule_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], self._json(get(_path(schedule_id, "runs"))))


class AsyncScheduleMethods:
    """asyncio schedule methods (AsyncClient)."""

    async def _json(self, req: Request) -> Any:
        raise NotImplementedError

    async def create_schedule(
        self,
        *,
        cron: str | None = None,
        timezone: str | None = None,
        every_s: float | None = None,
        queue: str | None = None,
        payload: Any = None,
        start_at: datetime | str | None = None,
        end_at: datetime | str | None = None,
        max_runs: int | None = None,
        retry: dict[str, Any] | None = None,
        catchup: Catchup | None = None,
        catchup_window_s: float | None = None,
        jitter_s: float | None = None,
        overlap: Overlap | None = None,
        paused: bool | None = None,
    ) -> Schedule:
        """See ScheduleMethods.create_schedule."""
        body = schedule_body(
            cron=cron,
            timezone=timezone,
            every_s=every_s,
            queue=queue,
            payload=payload,
            start_at=start_at,
            end_at=end_at,
            max_runs=max_runs,
            retry=retry,
            catchup=catchup,
            catchup_window_s=catchup_window_s,
            jitter_s=jitter_s,
            overlap=overlap,
            paused=paused,
        )
        return cast(Schedule, await self._json(Request("POST", "/v1/schedules", body)))

    async def get_schedule(self, schedule_id: str) -> Schedule:
        return cast(Schedule, await self._json(get(_path(schedule_id))))

    async def list_schedules(
        self, *, limit: int | None = None, cursor: str | None = None
    ) -> SchedulePage:
        """One page; a page may be short (even empty) while next_cursor is not None."""
        return cast(SchedulePage, await self._json(_list(limit, cursor)))

    async def update_schedule(
        self,
        schedule_id: str,
        *,
        cron: str | None = None,
        timezone: str | None = None,
        every_s: float | None = None,
        queue: str | None = None,
        payload: Any = None,
        start_at: datetime | str | None = None,
        end_at: datetime | str | None = None,
        max_runs: int | None = None,
        retry: dict[str, Any] | None = None,
        catchup: Catchup | None = None,
        catchup_window_s: float | None = None,
        jitter_s: float | None = None,
        overlap: Overlap | None = None,
        paused: bool | None = None,
    ) -> Schedule:
        """See ScheduleMethods.update_schedule."""
        body = schedule_body(
            cron=cron,
            timezone=timezone,
            every_s=every_s,
            queue=queue,
            payload=payload,
            start_at=start_at,
            end_at=end_at,
            max_runs=max_runs,
            retry=retry,
            catchup=catchup,
            catchup_window_s=catchup_window_s,
            jitter_s=jitter_s,
            overlap=overlap,
            paused=paused,
        )
        return cast(Schedule, await self._json(Request("PATCH", _path(schedule_id), body)))

    async def delete_schedule(self, schedule_id: str) -> Schedule:
        return cast(Schedule, await self._json(Request("DELETE", _path(schedule_id))))

    async def pause_schedule(self, schedule_id: str) -> Schedule:
        return cast(Schedule, await self._json(Request("POST", _path(schedule_id, "pause"))))

    async def resume_schedule(self, schedule_id: str) -> Schedule:
        return cast(Schedule, await self._json(Request("POST", _path(schedule_id, "resume"))))

    async def trigger_schedule(self, schedule_id: str) -> Schedule:
        return cast(Schedule, await self._json(Request("POST", _path(schedule_id, "trigger"))))

    async def backfill_schedule(
        self, schedule_id: str, *, start_at: datetime | str, end_at: datetime | str
    ) -> Schedule:
        req = Request("POST", _path(schedule_id, "backfill"), backfill_body(start_at, end_at))
        return cast(Schedule, await self._json(req))

    async def schedule_runs(self, schedule_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], await self._json(get(_path(schedule_id, "runs"))))
