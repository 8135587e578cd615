"""`timewheel task|dlq|tenant` against a real api process: each command once, --json
output parses, refusals exit 1 and bad arguments exit 2 with one line, no traceback."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from typing import Any

import pytest

from timewheel.cli.main import main
from timewheel.engine import Engine
from timewheel.runs.worker import Worker
from timewheel.testing.apiserver import ApiServer
from timewheel.testing.clock import FakeClock
from timewheel.testing.dispatch import prime, tick_all

CLI = [sys.executable, "-m", "timewheel.cli"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


async def test_every_client_command(
    api_server: ApiServer, capsys: pytest.CaptureFixture[str]
) -> None:
    url = ["--url", api_server.url]
    admin = [*url, "--key", api_server.admin_key]
    tenant = f"cli-{secrets.token_hex(3)}"
    made = run_json(capsys, "tenant", "create", tenant, "--max-pending", "100", *admin)
    assert made["id"] == tenant and made["limits"]["max_pending"] == 100
    changed = run_json(
        capsys,
        "tenant",
        "update",
        tenant,
        "--dispatch-rate",
        "2.5",
        "--max-pending",
        "none",
        *admin,
    )
    assert changed["limits"]["dispatch_rate"] == 2.5 and changed["limits"]["max_pending"] is None
    code, _, err = run(capsys, "tenant", "update", tenant, *admin)
    assert code == 2 and "give --max-payload-bytes" in err and "Traceback" not in err
    spread = run_json(capsys, "tenant", "update", tenant, "--shards", "2", *admin)
    assert spread["limits"]["shards"] == 2 and len(spread["shards"]) == 2
    code, _, err = run(capsys, "tenant", "update", tenant, "--shards", "4096", *admin)
    assert code == 1 and "422 too_many_shards" in err and "Traceback" not in err
    key = run_json(capsys, "tenant", "key", tenant, *admin)
    as_tenant = [*url, "--key", key["key"]]

    task = run_json(
        capsys,
        "task",
        "create",
        "--delay",
        "60",
        "--queue",
        "q1",
        "--payload",
        '{"a": 1}',
        "--max-attempts",
        "2",
        *as_tenant,
    )
    assert task["state"] == "scheduled" and task["payload"] == {"a": 1}
    code, out, _ = run(capsys, "task", "create", "--delay", "60", *as_tenant)
    assert code == 0 and "scheduled" in out and "ID" in out  # the table
    assert run_json(capsys, "task", "get", task["id"], *as_tenant)["queue"] == "q1"
    moved = run_json(capsys, "task", "reschedule", task["id"], "--delay", "120", *as_tenant)
    assert moved["id"] == task["id"]
    listed = run_json(capsys, "task", "list", "--queue", "q1", *as_tenant)
    assert [t["id"] for t in listed["items"]] == [task["id"]]
    runs = run_json(capsys, "task", "runs", task["id"], *as_tenant)
    assert runs["events"][0]["event"] == "created"
    assert run_json(capsys, "task", "cancel", task["id"], *as_tenant)["state"] == "cancelled"

    engine = await Engine.connect(api_server.settings)
    try:
        clock = FakeClock.from_wall_clock()  # the API makes tasks due on the real clock
        await prime(engine, clock.now_ms)
        dead = run_json(capsys, "task", "create", "--delay", "0", *as_tenant)
        await tick_all(engine, clock.advance(1000))
        worker = Worker(engine.store, tenant, "default")
        for delivery in await worker.read(count=10, block_ms=100):
            await worker.fail(delivery, "boom", permanent=True)
    finally:
        await engine.close()
    page = run_json(capsys, "dlq", "list", *as_tenant)
    assert [d["run_id"] for d in page["items"]] == [dead["id"]]
    assert run_json(capsys, "dlq", "replay", dead["id"], *as_tenant)["state"] == "scheduled"
    code, out, err = run(capsys, "dlq", "purge", dead["id"], *as_tenant)
    assert code == 1 and err.startswith("timewheel: 404 not_found") and err.count("\n") == 1

    revoked = run_json(capsys, "tenant", "key", tenant, "--revoke", key["key_id"], *admin)
    assert revoked == {"key_id": key["key_id"], "revoked": True}
    code, _, err = run(capsys, "tenant", "create", tenant, *admin)
    assert code == 1 and "409 conflict" in err


def test_cli_refusals_and_bad_arguments_have_no_traceback(api_server: ApiServer) -> None:
    env = {**os.environ, "TIMEWHEEL_URL": api_server.url, "TIMEWHEEL_KEY": "tw_wrong"}
    cases = [
        (["task", "get", "0000000000000000"], 1, "401 unauthorized"),
        (["task", "create", "--delay", "1", "--payload", "{bad"], 2, "not JSON"),
        (["task", "create"], 2, "one of the arguments --delay --run-at is required"),
        (["task", "list", "--limit", "0"], 2, "not a positive integer"),
        (["tenant", "create", "x", "--url", "http://127.0.0.1:1"], 1, "Connection refused"),
    ]
    for argv, code, message in cases:
        proc = subprocess.run([*CLI, *argv], capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode == code, (argv, proc.stderr)
        assert message in proc.stderr, (argv, proc.stderr)
        assert "Traceback" not in proc.stderr + proc.stdout
