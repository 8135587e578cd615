"""The SDK's schedule methods send what the schedules URL contract (issue 5) says: checked
against a recording transport, since the server side is built on another branch; and
the CLI's schedule commands reach the API (which answers 404 until those routes land)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import httpx

from tests.apiserver import ApiServer, api_server
from timewheel.client import AsyncClient, Client

__all__ = ["api_server"]


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.seen.append((request.method, request.url.path, body))
        return httpx.Response(200, json={"id": "s1"})


EXPECTED: list[tuple[str, str, Any]] = [
    ("POST", "/v1/schedules", {"cron": "0 9 * * *", "timezone": "Europe/Paris",
                               "catchup": "latest", "overlap": "skip", "queue": "q"}),
    ("GET", "/v1/schedules/s1", None),
    ("PATCH", "/v1/schedules/s1", {"every_s": 30, "paused": True}),
    ("POST", "/v1/schedules/s1/pause", None),
    ("POST", "/v1/schedules/s1/resume", None),
    ("POST", "/v1/schedules/s1/trigger", None),
    ("POST", "/v1/schedules/s1/backfill",
     {"start_at": "2026-11-01T00:00:00Z", "end_at": "2026-11-02T00:00:00Z"}),
    ("GET", "/v1/schedules/s1/runs", None),
    ("DELETE", "/v1/schedules/s1", None),
]


def test_schedule_methods_follow_the_url_contract() -> None:
    rec = Recorder()
    with Client("http://tw", "k", transport=httpx.MockTransport(rec)) as tw:
        tw.create_schedule(cron="0 9 * * *", timezone="Europe/Paris", catchup="latest",
                           overlap="skip", queue="q")
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
        await tw.create_schedule(cron="0 9 * * *", timezone="Europe/Paris", catchup="latest",
                                 overlap="skip", queue="q")
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


def test_schedule_cli_reaches_the_api(api_server: ApiServer) -> None:
    cli = [sys.executable, "-m", "timewheel.cli", "schedule"]
    conn = ["--url", api_server.url, "--key", api_server.admin_key]
    proc = subprocess.run([*cli, "create", "--every-s", "60", *conn], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1 and "404 not_found" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    proc = subprocess.run([*cli, "create", "--cron", "x", "--every-s", "1", *conn],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "not allowed with argument" in proc.stderr
