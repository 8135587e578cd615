"""The `timewheel` command as a user runs it: real processes, real ports."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import redis

from timewheel.store.library import OPERATIONS
from timewheel.store.server import RedisServer, find_free_port

CLI = [sys.executable, "-m", "timewheel.cli"]


def _wait_for(pattern: str, log: Path, timeout_s: float = 20.0) -> re.Match[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = re.search(pattern, log.read_text())
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"{pattern!r} not in output:\n{log.read_text()}")


def test_dev_runs_redis_api_and_scheduler_and_stops_cleanly(tmp_path: Path) -> None:
    api_port, redis_port = find_free_port(), find_free_port()
    log = tmp_path / "dev.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                *CLI,
                "dev",
                "--data-dir",
                str(tmp_path / "data"),
                "--port",
                str(api_port),
                "--redis-port",
                str(redis_port),
                # PostgreSQL's side: tests/process/test_dev_durability.py
                "--no-postgres",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "TIMEWHEEL_SHARDS": "16"},
        )
    try:
        _wait_for("scheduler_started", log)
        _wait_for("api_listening", log)
        key = _wait_for(r"export TIMEWHEEL_KEY=(\S+)", log).group(1)
        _wait_for(r"export TIMEWHEEL_ADMIN_KEY=\S+", log)
        auth = {"Authorization": f"Bearer {key}"}
        base = f"http://127.0.0.1:{api_port}"
        deadline = time.monotonic() + 10
        while True:  # uvicorn binds right after it logs
            try:
                resp = httpx.post(
                    f"{base}/v1/tasks", json={"delay": 0.5, "payload": {"hi": 1}}, headers=auth
                )
                break
            except httpx.ConnectError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        assert resp.status_code == 201, resp.text
        task_id = resp.json()["id"]
        client = redis.Redis(port=redis_port)
        try:
            assert client.config_get("appendonly") == {"appendonly": "yes"}
            assert client.config_get("appendfsync") == {"appendfsync": "always"}
            # dev's own processes talk to it over its Unix socket, owner only; the TCP
            # port serves everyone else
            sock = tmp_path / "data" / "redis" / "redis.sock"
            assert client.config_get("unixsocket") == {"unixsocket": str(sock.resolve())}
            assert sock.stat().st_mode & 0o777 == 0o700
            assert any("U" in c["flags"] for c in client.client_list())
            assert f"unix://{sock.resolve()}" in log.read_text()
            stream = f"{{tw:{int(task_id[:3], 16)}}}:q:default:default"
            deadline = time.monotonic() + 5
            while not client.xlen(stream):
                assert time.monotonic() < deadline, "run never reached its stream"
                time.sleep(0.05)
            entries: Any = client.xrange(stream)
            [(_, fields)] = entries
            assert fields[b"run_id"] == task_id.encode()
            assert fields[b"payload"] == b'{"hi":1}'
        finally:
            client.close()
        got = httpx.get(f"{base}/v1/tasks/{task_id}", headers=auth)
        assert got.json()["state"] == "dispatched"
        assert httpx.get(f"{base}/v1/tasks/{task_id}").status_code == 401
        assert (tmp_path / "data" / "redis" / "appendonlydir").is_dir()
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=20)
    assert code == 0, log.read_text()
    assert "Traceback" not in log.read_text()
    # The redis-server it started is gone with it.
    probe = redis.Redis(port=redis_port, socket_connect_timeout=0.5)
    try:
        probe.ping()
        alive = True
    except redis.ConnectionError:
        alive = False
    finally:
        probe.close()
    assert not alive


def test_bad_redis_url_is_a_clear_error_with_exit_code_2() -> None:
    done = subprocess.run(
        [*CLI, "api", "--redis-url", "http://nope"], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2
    assert "redis://" in done.stderr and "Traceback" not in done.stderr


def test_unreachable_redis_is_exit_code_1() -> None:
    port = find_free_port()
    done = subprocess.run(
        [*CLI, "scheduler", "--redis-url", f"redis://127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1
    assert "cannot reach Redis" in done.stderr and "Traceback" not in done.stderr


def test_bad_arguments_exit_2_without_traceback() -> None:
    done = subprocess.run(
        [*CLI, "dev", "--port", "eighty"], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2 and "invalid int value" in done.stderr
    assert "Traceback" not in done.stderr


def test_scripts_check_loads_every_script(standalone_url: str) -> None:
    done = subprocess.run(
        [*CLI, "scripts", "check", "--redis-url", standalone_url],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert f"({len(OPERATIONS)} functions) loads on" in done.stdout


def test_api_and_scheduler_refuse_a_redis_that_would_lose_tasks(tmp_path: Path) -> None:
    unsafe = RedisServer(
        tmp_path / "unsafe", extra_config={"appendonly": "no", "maxmemory-policy": "allkeys-lru"}
    )
    (tmp_path / "unsafe").mkdir()
    with unsafe:
        for command in ("api", "scheduler"):
            done = subprocess.run(
                [*CLI, command, "--redis-url", unsafe.url],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert done.returncode == 2, done.stderr
            assert "appendonly is 'no'" in done.stderr
            assert "maxmemory-policy is 'allkeys-lru'" in done.stderr
            assert "--unsafe-durability" in done.stderr and "Traceback" not in done.stderr
        node = subprocess.Popen(
            [*CLI, "scheduler", "--redis-url", unsafe.url, "--unsafe-durability"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            deadline = time.monotonic() + 20
            assert node.stdout is not None
            while "scheduler_started" not in node.stdout.readline():
                assert time.monotonic() < deadline and node.poll() is None
        finally:
            node.send_signal(signal.SIGTERM)
            assert node.wait(timeout=20) == 0
            if node.stdout is not None:
                node.stdout.close()
