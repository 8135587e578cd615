"""`timewheel dev` with its own PostgreSQL, as docs/operations/durability.md tells a user
to run it: the DSN is printed, the archiver and the snapshots run, the keys survive a
restart, and `timewheel dev --restore` brings the work back after Redis lost its data:
tenants with their limits and keys, scheduled runs, dead letters, finished records
(their idempotency keys) and schedules."""

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
from collections.abc import Callable, Iterator
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

    def delete(self, path: str, key: str) -> httpx.Response:
        return httpx.delete(f"{self.base}{path}", headers={"Authorization": f"Bearer {key}"})

    def post(self, path: str, key: str, body: dict[str, object]) -> httpx.Response:
        return httpx.post(
            f"{self.base}{path}", json=body, headers={"Authorization": f"Bearer {key}"}
        )

    def redis_url(self) -> str:
        return self.wait_for(r"redis (redis://\S+)").group(1)

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


class Worker:
    """`timewheel worker` with timewheel.testing.apps:drill for one tenant's queue `jobs`:
    a payload {"fail": true} dies (a dead letter) until the file `healed` exists."""

    def __init__(self, redis_url: str, tenant: str, tmp: Path, name: str) -> None:
        self.handled_log = tmp / "handled.log"
        self.healed = tmp / "healed"
        self.log = tmp / f"{name}.log"
        command = [*CLI, "worker", "--app", "timewheel.testing.apps:drill", "--tenant", tenant]
        command += ["--queue", "jobs", "--redis-url", redis_url]
        env = {**os.environ, "TIMEWHEEL_SHARDS": "16", "TW_TEST_LOG": str(self.handled_log)}
        env["TW_TEST_HEALED"] = str(self.healed)
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _until(what: str, check: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(0.2)


def test_dev_restore_brings_back_tenants_keys_limits_dead_letters_and_finished_runs(
    data_dir: Path, tmp_path: Path
) -> None:
    """The runbook's dev drill: build up tenants, keys, limits, scheduled, dead and
    succeeded runs and a schedule under `timewheel dev`; stop it (Ctrl-C), lose the Redis
    data, start `timewheel dev --restore`; everything a tenant relies on is back."""
    dev = Dev(data_dir, tmp_path / "dev1.log", "--redis-port", "0", "--snapshot-every", "0.05")
    worker: Worker | None = None
    try:
        dsn = dev.export("TIMEWHEEL_POSTGRES_DSN")
        admin, key = dev.export("TIMEWHEEL_ADMIN_KEY"), dev.export("TIMEWHEEL_KEY")
        dev.ready()
        # A second tenant, with limits and a key of its own, through the admin API.
        made = dev.post("/v1/tenants", admin, {"id": "acme", "limits": {"max_pending": 2}})
        assert made.status_code == 201, made.text
        issued = dev.post("/v1/tenants/acme/keys", admin, {})
        assert issued.status_code == 201, issued.text
        acme = issued.json()["key"]
        # A run that succeeds (with an idempotency key) and one that dies at once.
        worker = Worker(dev.redis_url(), "acme", tmp_path, "worker1")
        once = dev.post(
            "/v1/tasks",
            acme,
            {"delay": 0, "queue": "jobs", "payload": {"k": 1}, "idempotency_key": "once"},
        )
        assert once.status_code == 201, once.text
        fails = {"delay": 0, "queue": "jobs", "payload": {"fail": True}}
        doomed = dev.post("/v1/tasks", acme, {**fails, "retry": {"max_attempts": 1}})
        assert doomed.status_code == 201, doomed.text
        once_id, dead_id = once.json()["id"], doomed.json()["id"]

        def state(task_id: str) -> str:
            return str(dev.get(f"/v1/tasks/{task_id}", acme).json()["state"])

        _until("the runs finish", lambda: (state(once_id), state(dead_id)) == ("succeeded", "dead"))
        worker.stop()
        # acme at its max_pending of 2; the default tenant with a schedule and a run.

        def create_far(n: int) -> httpx.Response:
            """A create retried while the finished runs may still count as pending (the
            usage count follows the worker's acks a moment after GET shows them)."""
            deadline = time.monotonic() + 20
            while True:
                made = dev.post("/v1/tasks", acme, {"delay": 3600, "payload": {"far": n}})
                if made.status_code != 429 or time.monotonic() > deadline:
                    return made
                time.sleep(0.2)

        far = [create_far(i) for i in (1, 2)]
        assert [r.status_code for r in far] == [201, 201], [r.text for r in far]
        far_ids = [r.json()["id"] for r in far]
        over = dev.post("/v1/tasks", acme, {"delay": 3600, "payload": {"far": 3}})
        assert over.status_code == 429, over.text
        mine = dev.post("/v1/tasks", key, {"delay": 3600, "payload": {"n": 1}})
        assert mine.status_code == 201, mine.text
        sched = dev.post("/v1/schedules", key, {"every_s": 3600, "payload": {"s": 1}})
        assert sched.status_code == 201, sched.text
        # All of it archived (events and the key's hash), and a snapshot complete.
        wanted = [(once_id, "acked"), (dead_id, "dead"), (mine.json()["id"], "created")]
        wanted += [(task_id, "created") for task_id in far_ids]
        for run_id, kind in wanted:
            query = "SELECT count(*) FROM run_events WHERE run_id = %s AND kind = %s"
            assert _poll(query, (run_id, kind), dsn) == 1, (run_id, kind)
        in_table = "SELECT count(*) FROM schedules WHERE schedule_id = %s"
        assert _poll(in_table, (sched.json()["id"],), dsn) == 1
        assert _poll("SELECT count(*) FROM api_keys WHERE tenant = 'acme'", (), dsn) == 1
        complete = "SELECT count(*) FROM snapshots WHERE finished_at IS NOT NULL"
        assert _poll(complete, (), dsn) >= 1
    finally:
        if worker is not None:
            worker.stop()
        dev.stop()

    # The runbook: Ctrl-C (done), the Redis data is lost, `timewheel dev --restore`.
    shutil.rmtree(data_dir / "redis")
    dev = Dev(data_dir, tmp_path / "dev2.log", "--redis-port", "0", "--restore")
    worker = None
    try:
        assert dev.export("TIMEWHEEL_ADMIN_KEY") == admin
        assert dev.export("TIMEWHEEL_KEY") == key  # the same string, not a new key
        dev.ready()
        assert re.search(r"restored [1-9]\d* runs from snapshot \d+", dev.log.read_text())
        # The old keys, as they were issued, and the tenant's limits.
        tenant = dev.get("/v1/tenants/acme", admin)
        assert tenant.status_code == 200, tenant.text
        assert tenant.json()["limits"]["max_pending"] == 2
        for task_id in far_ids:
            got = dev.get(f"/v1/tasks/{task_id}", acme)
            assert got.status_code == 200, (got.text, dev.log.read_text()[-3000:])
            assert got.json()["state"] == "scheduled"
        assert dev.get(f"/v1/tasks/{mine.json()['id']}", key).json()["payload"] == {"n": 1}
        over = dev.post("/v1/tasks", acme, {"delay": 3600, "payload": {"far": 3}})
        assert over.status_code == 429, over.text
        assert over.json()["error"]["field"] == "max_pending"
        schedule = dev.get(f"/v1/schedules/{sched.json()['id']}", key)
        assert schedule.status_code == 200, schedule.text
        assert schedule.json()["state"] == "active"
        # The finished run: GET answers, its idempotency key still finds it.
        assert state(once_id) == "succeeded"
        assert dev.delete(f"/v1/tasks/{far_ids[0]}", acme).status_code == 200
        again = dev.post(
            "/v1/tasks",
            acme,
            {"delay": 0, "queue": "jobs", "payload": {"k": 1}, "idempotency_key": "once"},
        )
        assert again.status_code == 200, again.text
        assert again.json()["id"] == once_id
        # The dead letter lists, with its reason, and replays; a healed worker runs it.
        letters = dev.get("/v1/dead-letters", acme).json()["items"]
        assert [d["run_id"] for d in letters] == [dead_id], letters
        assert letters[0]["payload"] == {"fail": True}
        replayed = dev.post(f"/v1/dead-letters/{dead_id}/replay", acme, {})
        assert replayed.status_code == 200, replayed.text
        assert dev.get("/v1/dead-letters", acme).json()["items"] == []
        worker = Worker(dev.redis_url(), "acme", tmp_path, "worker2")
        worker.healed.touch()
        _until("the replayed run succeeds", lambda: state(dead_id) == "succeeded")
    finally:
        if worker is not None:
            worker.stop()
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
