"""`timewheel dev` with its own PostgreSQL, as docs/operations/durability.md tells a user
to run it: the DSN is printed, the archiver and the snapshots run, the keys survive a
restart, and `timewheel dev --restore` brings the work back after Redis lost its data."""

from __future__ import annotations

import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from timewheel.store.server import find_free_port

CLI = [sys.executable, "-m", "timewheel.cli"]
START_TIMEOUT_S = 60.0


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A data folder the `postgres` OS user can reach when the tests run as root (pytest's
    tmp_path has 0700 parents)."""
    root = Path(tempfile.mkdtemp(prefix="tw-dev-"))
    os.chmod(root, 0o755)
    try:
        yield root / ".timewheel"
    finally:
        shutil.rmtree(root, ignore_errors=True)


class Dev:
    """One `timewheel dev` process and the lines it printed."""

    def __init__(self, data: Path, log: Path, *flags: str) -> None:
        self.port = find_free_port()
        self.log = log
        self.base = f"http://127.0.0.1:{self.port}"
        with log.open("w") as out:
            self.proc = subprocess.Popen(
                [*CLI, "dev", "--data-dir", str(data), "--port", str(self.port), *flags],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "TIMEWHEEL_SHARDS": "16"},
            )

    def wait_for(self, pattern: str, timeout_s: float = START_TIMEOUT_S) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = re.search(pattern, self.log.read_text())
            if found:
                return found
            assert self.proc.poll() is None, self.log.read_text()
            time.sleep(0.1)
        raise AssertionError(f"{pattern!r} not in output:\n{self.log.read_text()}")

    def export(self, name: str) -> str:
        return self.wait_for(rf"export {name}=(\S+)").group(1)

    def ready(self) -> None:
        self.wait_for("scheduler_started")
        self.wait_for("api_listening")
        deadline = time.monotonic() + 20
        while True:  # uvicorn binds right after it logs
            try:
                httpx.get(f"{self.base}/healthz")
                return
            except httpx.ConnectError:
                assert time.monotonic() < deadline, self.log.read_text()
                time.sleep(0.05)

    def get(self, path: str, key: str) -> httpx.Response:
        return httpx.get(f"{self.base}{path}", headers={"Authorization": f"Bearer {key}"})

    def post(self, path: str, key: str, body: dict[str, object]) -> httpx.Response:
        return httpx.post(
            f"{self.base}{path}", json=body, headers={"Authorization": f"Bearer {key}"}
        )

    def stop(self) -> str:
        """Ctrl-C; the output, after checking dev exited 0 without a traceback."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(timeout=60)
        text = self.log.read_text()
        assert code == 0, text
        assert "Traceback" not in text, text
        return text


def _reachable(dsn: str) -> bool:
    try:
        with psycopg.connect(dsn, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError:
        return False
    return True


def _poll(query: str, params: tuple[object, ...], dsn: str, timeout_s: float = 30.0) -> int:
    """Run a count query until it is positive; the count."""
    deadline = time.monotonic() + timeout_s
    while True:
        with psycopg.connect(dsn) as conn:
            row = conn.execute(query, params).fetchone()
        count = 0 if row is None else int(str(row[0]))
        if count or time.monotonic() >= deadline:
            return count
        time.sleep(0.2)


def test_dev_archives_keeps_its_keys_and_restores_from_its_own_postgres(
    data_dir: Path, tmp_path: Path
) -> None:
    # First start: `timewheel dev` (docs/operations/durability.md, Dev).
    dev = Dev(data_dir, tmp_path / "dev1.log", "--redis-port", "0", "--snapshot-every", "0.05")
    try:
        dsn = dev.export("TIMEWHEEL_POSTGRES_DSN")
        admin, key = dev.export("TIMEWHEEL_ADMIN_KEY"), dev.export("TIMEWHEEL_KEY")
        dev.ready()
        assert _reachable(dsn)
        created = dev.post("/v1/tasks", key, {"delay": 3600, "payload": {"n": 1}})
        assert created.status_code == 201, created.text
        task_id = created.json()["id"]
        sched = dev.post("/v1/schedules", key, {"every_s": 3600, "payload": {"s": 1}})
        assert sched.status_code == 201, sched.text
        schedule_id = sched.json()["id"]
        archived = "SELECT count(*) FROM run_events WHERE run_id = %s AND kind = 'created'"
        assert _poll(archived, (task_id,), dsn) == 1
        in_snapshot = (
            "SELECT count(*) FROM snapshot_tasks t JOIN snapshots s USING (snapshot_id)"
            " WHERE t.run_id = %s AND s.finished_at IS NOT NULL"
        )
        assert _poll(in_snapshot, (task_id,), dsn) >= 1
    finally:
        dev.stop()
    assert not _reachable(dsn), "dev's PostgreSQL outlived it"
    credentials = data_dir / "credentials.json"
    assert stat.S_IMODE(credentials.stat().st_mode) == 0o600

    # A restart keeps the keys, the DSN and the data.
    dev = Dev(data_dir, tmp_path / "dev2.log", "--redis-port", "0")
    try:
        assert dev.export("TIMEWHEEL_ADMIN_KEY") == admin
        assert dev.export("TIMEWHEEL_KEY") == key
        assert dev.export("TIMEWHEEL_POSTGRES_DSN") == dsn
        dev.ready()
        assert dev.get("/v1/tenants/default", admin).status_code == 200
        assert dev.get(f"/v1/tasks/{task_id}", key).json()["state"] == "scheduled"
    finally:
        dev.stop()

    # Redis loses its data; `timewheel dev --restore` rebuilds it from PostgreSQL.
    shutil.rmtree(data_dir / "redis")
    dev = Dev(data_dir, tmp_path / "dev3.log", "--redis-port", "0", "--restore")
    try:
        assert dev.export("TIMEWHEEL_ADMIN_KEY") == admin
        restored_key = dev.export("TIMEWHEEL_KEY")
        dev.ready()
        assert re.search(r"restored [1-9]\d* runs from snapshot \d+", dev.log.read_text())
        task = dev.get(f"/v1/tasks/{task_id}", restored_key)
        assert task.status_code == 200, task.text
        assert task.json()["state"] == "scheduled"
        assert task.json()["payload"] == {"n": 1}
        schedule = dev.get(f"/v1/schedules/{schedule_id}", restored_key)
        assert schedule.status_code == 200, schedule.text
        assert schedule.json()["state"] == "active"
        assert dev.get("/v1/tenants/default", admin).status_code == 200
    finally:
        dev.stop()


def test_restore_moves_the_redis_data_aside(data_dir: Path, tmp_path: Path) -> None:
    dev = Dev(data_dir, tmp_path / "dev1.log", "--redis-port", "0")
    try:
        dev.ready()
        key = dev.export("TIMEWHEEL_KEY")
        created = dev.post("/v1/tasks", key, {"delay": 3600, "payload": {"n": 2}})
        assert created.status_code == 201, created.text
        dsn = dev.export("TIMEWHEEL_POSTGRES_DSN")
        archived = "SELECT count(*) FROM run_events WHERE run_id = %s"
        assert _poll(archived, (created.json()["id"],), dsn) >= 1
        # --restore needs a complete snapshot: the one dev takes at start may still run.
        complete = "SELECT count(*) FROM snapshots WHERE finished_at IS NOT NULL"
        assert _poll(complete, (), dsn) >= 1
    finally:
        dev.stop()
    dev = Dev(data_dir, tmp_path / "dev2.log", "--redis-port", "0", "--restore")
    try:
        moved = Path(dev.wait_for(r"moved the Redis data to (\S+)").group(1))
        dev.ready()
        key = dev.export("TIMEWHEEL_KEY")
        assert dev.get(f"/v1/tasks/{created.json()['id']}", key).status_code == 200
    finally:
        dev.stop()
    assert moved.parent == data_dir and moved.name.startswith("redis.before-restore-")
    assert (moved / "appendonlydir").is_dir()


def test_new_keys_replaces_both_keys(data_dir: Path, tmp_path: Path) -> None:
    dev = Dev(data_dir, tmp_path / "dev1.log", "--redis-port", "0", "--no-postgres")
    try:
        admin, key = dev.export("TIMEWHEEL_ADMIN_KEY"), dev.export("TIMEWHEEL_KEY")
    finally:
        dev.stop()
    dev = Dev(data_dir, tmp_path / "dev2.log", "--redis-port", "0", "--no-postgres", "--new-keys")
    try:
        new_admin, new_key = dev.export("TIMEWHEEL_ADMIN_KEY"), dev.export("TIMEWHEEL_KEY")
        dev.ready()
        assert {new_admin, new_key}.isdisjoint({admin, key})
        assert dev.get("/v1/tasks", new_key).status_code == 200
        assert dev.get("/v1/tasks", key).status_code == 401
        assert dev.get("/v1/tenants/default", admin).status_code == 401
    finally:
        dev.stop()


def test_no_postgres_starts_no_postgres(data_dir: Path, tmp_path: Path) -> None:
    dev = Dev(data_dir, tmp_path / "dev.log", "--redis-port", "0", "--no-postgres")
    try:
        dev.ready()
        dev.export("TIMEWHEEL_KEY")
    finally:
        text = dev.stop()
    assert "TIMEWHEEL_POSTGRES_DSN" not in text
    assert "archiver_started" not in text
    assert not (data_dir / "postgres").exists()
