"""The requests the SDK's schedule methods send, sync and async, on a recording
transport."""

from __future__ import annotations

import json
from typing import Any

import httpx

from timewheel.sdk.client import AsyncClient, Client


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.seen.append((request.method, request.url.path, body))
        return httpx.Response(200, json={"id": "s1"})


EXPECTED: list[tuple[str, str, Any]] = [
    (
        "POST",
        "/v1/schedules",
        {
            "cron": "0 9 * * *",
            "timezone": "Europe/Paris",
            "catchup": "latest",
            "overlap": "skip",
            "queue": "q",
        },
    ),
    ("GET", "/v1/schedules/s1", None),
    ("PATCH", "/v1/schedules/s1", {"every_s": 30, "paused": True}),
    ("POST", "/v1/schedules/s1/pause", None),
    ("POST", "/v1/schedules/s1/resume", None),
    ("POST", "/v1/schedules/s1/trigger", None),
    (
        "POST",
        "/v1/schedules/s1/backfill",
        {"from": "2026-11-01T00:00:00Z", "to": "2026-11-02T00:00:00Z"},
    ),
    ("GET", "/v1/schedules/s1/runs", None),
    ("DELETE", "/v1/schedules/s1", None),
]


def test_schedule_methods_follow_the_url_contract() -> None:
    rec = Recorder()
    with Client("http://tw", "k", transport=httpx.MockTransport(rec)) as tw:
        tw.create_schedule(
            cron="0 9 * * *", timezone="Europe/Paris", catchup="latest", overlap="skip", queue="q"
        )
        tw.get_schedule("s1")
        tw.update_schedule("s1", every_s=30, paused=True)
        tw.pause_schedule("s1")
        tw.resume_schedule("s1")
        tw.trigger_schedule("s1")
        tw.backfill_schedule("s1", start_at="2026-11-01T00:00:00Z", end_at="2026-11-02T00:00:00Z")
        tw.schedule_runs("s1")
        tw.delete_schedule("s1")
    assert rec.seen == EXPECTED


async def test_async_schedule_methods_follow_the_url_contract() -> None:
    rec = Recorder()
    async with AsyncClient("http://tw", "k", transport=httpx.MockTransport(rec)) as tw:
        await tw.create_schedule(
            cron="0 9 * * *", timezone="Europe/Paris", catchup="latest", overlap="skip", queue="q"
        )
        await tw.get_schedule("s1")
        await tw.update_schedule("s1", every_s=30, paused=True)
        await tw.pause_schedule("s1")
        await tw.resume_schedule("s1")
        await tw.trigger_schedule("s1")
        await tw.backfill_schedule(
            "s1", start_at="2026-11-01T00:00:00Z", end_at="2026-11-02T00:00:00Z"
        )
        await tw.schedule_runs("s1")
        await tw.delete_schedule("s1")
    assert rec.seen == EXPECTED
