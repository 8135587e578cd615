"""The SDK's schedule methods and the CLI's schedule commands: every schedule endpoint
through them against a real api process and redis-server, with its error codes."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys

import pytest

from timewheel.errors import NotFoundError, PermissionDeniedError, UnprocessableError
from timewheel.sdk.client import Client
from timewheel.testing.apiserver import ApiServer


@pytest.fixture
def tenant_key(api_server: ApiServer) -> str:
    with Client(api_server.url, api_server.admin_key) as admin:
        name = f"sched-{secrets.token_hex(3)}"
        admin.create_tenant(name)
        return str(admin.create_key(name)["key"])


def test_every_schedule_endpoint_through_the_sdk(api_server: ApiServer, tenant_key: str) -> None:
    with Client(api_server.url, tenant_key) as tw:
        s = tw.create_schedule(
            cron="30 2 * * *",
            timezone="America/New_York",
            queue="nightly",
            payload={"job": "sync"},
            catchup="all",
            overlap="buffer_one",
        )
        sid = s["id"]
        assert (s["state"], s["timezone"], s["overlap"]) == (
            "active",
            "America/New_York",
            "buffer_one",
        )
        assert tw.get_schedule(sid)["payload"] == {"job": "sync"}
        assert tw.update_schedule(sid, every_s=3600)["every_s"] == 3600
        assert tw.update_schedule(sid, paused=True)["state"] == "paused"
        assert tw.resume_schedule(sid)["state"] == "active"
        assert tw.pause_schedule(sid)["state"] == "paused"
        assert tw.update_schedule(sid, paused=False)["state"] == "active"
        run_id = tw.trigger_schedule(sid)["run_id"]
        assert run_id.startswith(f"{sid}@manual-")
        assert tw.get_task(run_id)["schedule_id"] == sid
        back = tw.backfill_schedule(
            sid, start_at="2026-11-01T00:00:00Z", end_at="2026-11-01T05:00:00Z"
        )
        assert (back["added"], back["existing"]) == (6, 0)
        assert tw.schedule_runs(sid)["schedule_id"] == sid
        assert tw.delete_schedule(sid)["deleted"] is True
        with pytest.raises(NotFoundError):
            tw.get_schedule(sid)
        with pytest.raises(UnprocessableError) as bad:
            tw.create_schedule(cron="0 9 * * *", timezone="Mars/Olympus")
        assert bad.value.field == "timezone"
        with pytest.raises(UnprocessableError) as bad:
            tw.create_schedule(
                every_s=60, start_at="2027-01-02T00:00:00Z", end_at="2027-01-01T00:00:00Z"
            )
        assert bad.value.field == "end_at"
        other = tw.create_schedule(every_s=60)["id"]
    with (
        Client(api_server.url, api_server.admin_key) as admin,
        pytest.raises(
            PermissionDeniedError  # schedules are a tenant's: the admin key is refused
        ),
    ):
        admin.get_schedule(other)


def test_schedule_cli(api_server: ApiServer, tenant_key: str) -> None:
    cli = [sys.executable, "-m", "timewheel.cli", "schedule"]
    conn = ["--url", api_server.url, "--key", tenant_key, "--json"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli, *args, *conn], capture_output=True, text=True, timeout=60)

    made = run(
        "create",
        "--every-s",
        "60",
        "--payload",
        '{"a": 1}',
        "--overlap",
        "skip",
        "--jitter-s",
        "30",
    )
    assert made.returncode == 0, made.stderr
    sid = json.loads(made.stdout)["id"]
    listed = run("list")
    assert listed.returncode == 0, listed.stderr
    assert sid in [s["id"] for s in json.loads(listed.stdout)]
    for action, check in (
        ("get", lambda out: out["overlap"] == "skip" and out["jitter_s"] == 30),
        ("pause", lambda out: out["state"] == "paused"),
        ("resume", lambda out: out["state"] == "active"),
        ("trigger", lambda out: out["run_id"].startswith(sid)),
        ("runs", lambda out: out["schedule_id"] == sid),
        ("delete", lambda out: out["deleted"] is True),
    ):
        proc = run(action, sid)
        assert proc.returncode == 0, (action, proc.stderr)
        assert check(json.loads(proc.stdout)), action
    gone = run("get", sid)
    assert gone.returncode == 1 and "404 not_found" in gone.stderr
    assert "Traceback" not in gone.stderr
    proc = subprocess.run(
        [*cli, "create", "--cron", "x", "--every-s", "1", *conn],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "not allowed with argument" in proc.stderr
    bad = run("create", "--cron", "61 * * * *")
    assert bad.returncode == 1 and "422" in bad.stderr and "Traceback" not in bad.stderr
