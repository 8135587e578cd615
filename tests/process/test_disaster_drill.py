"""Disaster drills on real servers and real `timewheel` processes.

The whole Redis is lost (kill -9, its data deleted, a new empty server on the same
port or ports) under a running api, scheduler, worker and webhook executor, and
`timewheel restore` rebuilds it from PostgreSQL: every acknowledged and archived task
is back in its state, old keys work, limits hold, dead letters list and replay, and the
executors that kept running deliver new runs without a restart, each run once.
On standalone Redis and on a 3-primary Cluster.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from timewheel.config import Settings
from timewheel.engine import Engine
from timewheel.store.server import RedisServer
from timewheel.testing.apiserver import ApiServer, start_api
from timewheel.testing.archive import archive_all
from timewheel.testing.nodes import settings_env
from timewheel.testing.redis_cluster import RedisClusterServers
from timewheel.testing.waiting import until

CLI = [sys.executable, "-m", "timewheel.cli"]
FINAL = ("succeeded", "dead", "cancelled")


@dataclass
class Drill:
    """The processes of one deployment and what the test did through its API."""

    redis_url: str
    dsn: str
    tmp: Path
    hook_url: str
    api: ApiServer | None = None
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)

    @property
    def settings(self) -> Settings:
        assert self.api is not None
        return self.api.settings

    @property
    def worker_log(self) -> Path:
        return self.tmp / "handled.log"

    @property
    def healed(self) -> Path:
        return self.tmp / "healed"

    def env(self) -> dict[str, str]:
        return {
            **settings_env(self.settings),
            "TW_TEST_LOG": str(self.worker_log),
            "TW_TEST_HEALED": str(self.healed),
            "TIMEWHEEL_POSTGRES_DSN": self.dsn,
        }

    def start(self) -> None:
        log = self.tmp / "api.log"
        proc, self.api = start_api(self.redis_url, log)
        self.procs["api"], self.logs["api"] = proc, log
        url = ["--redis-url", self.redis_url]
        self._spawn("scheduler", ["scheduler", *url])
        self._spawn(
            "worker",
            ["worker", "--app", "timewheel.testing.apps:drill", "--tenant", "a", "--queue",
             "jobs", *url],
        )  # fmt: skip
        self._spawn(
            "webhook",
            ["webhook", "--url", self.hook_url, "--tenant", "a", "--queue", "hooks", *url],
        )

    def _spawn(self, name: str, args: list[str]) -> None:
        path = self.tmp / f"{name}.log"
        with path.open("wb") as out:
            self.procs[name] = subprocess.Popen(
                [*CLI, *args], stdout=out, stderr=subprocess.STDOUT, env=self.env()
            )
        self.logs[name] = path

    def alive(self) -> None:
        for name, proc in self.procs.items():
            assert proc.poll() is None, f"{name} exited:\n{self.logs[name].read_text()[-3000:]}"

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CLI, *args, "--redis-url", self.redis_url, "--postgres-dsn", self.dsn],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=180,
            stdin=subprocess.DEVNULL,
        )

    def handled(self) -> list[str]:
        """Run ids the worker's handler finished, one line each."""
        if not self.worker_log.exists():
            return []
        return [line.split()[0] for line in self.worker_log.read_text().splitlines() if line]


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def run_drill(
    drill: Drill, hooks: list[str], wipe: Callable[[], None], *, runs: int = 20
) -> None:
    """The drill: build up a deployment, lose Redis (`wipe`), restore, check."""
    drill.start()
    assert drill.api is not None
    admin = _bearer(drill.api.admin_key)
    engine = await Engine.connect(drill.settings)
    http = httpx.AsyncClient(base_url=drill.api.url, timeout=30)
    try:
        # Tenants with limits and keys: one revoked before the archiver saw it, one
        # after; one issued after the snapshot.
        for tid, limits in (("a", {"max_pending": 500}), ("b", {"max_pending": 3})):
            made = await http.post("/v1/tenants", json={"id": tid, "limits": limits}, headers=admin)
            assert made.status_code == 201, made.text
        keys = {n: (await http.post(f"/v1/tenants/{n[0]}/keys", headers=admin)).json()
                for n in ("a1", "a2", "b1", "b2")}  # fmt: skip
        gone = await http.delete(f"/v1/tenants/a/keys/{keys['a2']['key_id']}", headers=admin)
        assert gone.status_code in (200, 204), gone.text
        a, b = _bearer(keys["a1"]["key"]), _bearer(keys["b1"]["key"])

        async def create(who: dict[str, str], **body: Any) -> str:
            resp = await http.post("/v1/tasks", json=body, headers=who)
            assert resp.status_code == 201, resp.text
            return str(resp.json()["id"])

        # Tasks: succeeded (worker and webhook), dead, in flight (a queue nobody serves),
        # scheduled far ahead, cancelled; b at its max_pending of 3.
        jobs = [await create(a, delay=0, queue="jobs", payload={"n": i}) for i in range(runs)]
        keyed = await create(a, delay=0, queue="jobs", payload={"k": 1}, idempotency_key="once")
        hooked = [await create(a, delay=0, queue="hooks", payload={"h": i}) for i in range(runs)]
        dead = [
            await create(a, delay=0, queue="jobs", payload={"fail": True, "d": i}) for i in range(3)
        ]
        flight = [await create(a, delay=0, queue="idle", payload={"f": i}) for i in range(3)]
        far = [await create(a, delay=3600, payload={"far": i}) for i in range(runs)]
        far_b = [await create(b, delay=3600, payload={"b": i}) for i in range(3)]
        cancelled = await create(a, delay=3600, payload={"c": 1})
        assert (await http.delete(f"/v1/tasks/{cancelled}", headers=a)).status_code == 200
        sched = await http.post(
            "/v1/schedules",
            json={"every_s": 3600, "queue": "sched", "payload": {"s": 1}},
            headers=a,
        )
        assert sched.status_code == 201, sched.text
        schedule_id = sched.json()["id"]

        async def states(ids: list[str], tenant: str = "a") -> list[str]:
            return [(await engine.tasks.get(tenant, t)).state for t in ids]

        async def settled() -> bool:
            done = await states([*jobs, keyed, *hooked, *dead])
            inflight = await states(flight)
            return all(s in FINAL for s in done) and set(inflight) == {"dispatched"}

        await until("the first runs settle", settled)
        assert set(await states([*jobs, keyed, *hooked])) == {"succeeded"}
        assert set(await states(dead)) == {"dead"}
        await archive_all(engine, drill.dsn)
        snap = drill.cli("snapshot")
        assert snap.returncode == 0, snap.stderr

        # After the snapshot, in the archived logs only.
        late_key = (await http.post("/v1/tenants/a/keys", headers=admin)).json()
        gone = await http.delete(f"/v1/tenants/b/keys/{keys['b2']['key_id']}", headers=admin)
        assert gone.status_code in (200, 204)
        late = [await create(a, delay=3600, payload={"late": i}) for i in range(3)]
        await archive_all(engine, drill.dsn)
        kept = [*jobs, keyed, *hooked, *dead, *far, cancelled, *late]
        expected = {t: await engine.tasks.get("a", t) for t in kept}
        before_worker, before_hooks = Counter(drill.handled()), Counter(hooks)
        assert set(before_worker) == {*jobs, keyed} and set(before_hooks) == set(hooked)
        await engine.close()

        wipe()  # Redis is gone: kill -9, data deleted, a new empty server
        await asyncio.sleep(1.0)  # the executors meet the dead and the empty server
        drill.alive()
        # The running scheduler and executors write into the new server already (layout,
        # leases, their groups): it is not empty, and --force says that is expected.
        done = drill.cli("restore", "--force")
        assert done.returncode == 0, done.stderr
        [summary] = done.stdout.strip().splitlines()
        assert summary.startswith("restored ") and "3 dead letters" in summary, summary

        engine = await Engine.connect(drill.settings)
        for task_id, want in expected.items():
            got = await engine.tasks.get("a", task_id)
            assert (got.state, got.payload_json, got.queue) == (
                want.state,
                want.payload_json,
                want.queue,
            ), task_id
        assert set(await states(far_b, "b")) == {"scheduled"}
        # In flight at the loss: back, and out again under the same run ids.
        await until("in-flight runs go out again", lambda: _all(states(flight), "dispatched"))
        assert {(await engine.tasks.get("a", t)).attempt for t in flight} == {2}

        await asyncio.sleep(1.2)  # past the api's 1 s cache of keys and tenants

        async def answers() -> bool:
            # The api's connections from before the rebuild fail once (503); it then
            # starts afresh (api/endpoints.py), as a client's retry finds.
            return (await http.get("/v1/tenants/b", headers=admin)).status_code != 503

        await until("the api answers after the rebuild", answers, timeout_s=10)
        for key in (keys["a1"], keys["b1"], late_key):
            assert (await http.get("/v1/tasks", headers=_bearer(key["key"]))).status_code == 200
        for key in (keys["a2"], keys["b2"]):
            assert (await http.get("/v1/tasks", headers=_bearer(key["key"]))).status_code == 401
        tenant_b = await http.get("/v1/tenants/b", headers=admin)
        assert tenant_b.status_code == 200 and tenant_b.json()["limits"]["max_pending"] == 3
        over = await http.post("/v1/tasks", json={"delay": 60}, headers=b)
        assert over.status_code == 429, over.text  # b's 3 pending runs were counted again
        again = await http.post(
            "/v1/tasks", json={"delay": 0, "queue": "jobs", "idempotency_key": "once"}, headers=a
        )
        assert (again.status_code, again.json()["id"]) == (200, keyed)
        got_schedule = await http.get(f"/v1/schedules/{schedule_id}", headers=a)
        assert got_schedule.status_code == 200 and got_schedule.json()["state"] == "active"
        letters = (await http.get("/v1/dead-letters", headers=a)).json()["items"]
        assert {d["run_id"] for d in letters} == set(dead)
        assert {d["reason"] for d in letters} == {"failed"}

        # The executors that kept running deliver new runs and the replayed dead letters.
        drill.healed.touch()
        for task_id in dead:
            replayed = await http.post(f"/v1/dead-letters/{task_id}/replay", headers=a)
            assert replayed.status_code == 200, replayed.text
        new_jobs = [await create(a, delay=0, queue="jobs", payload={"m": i}) for i in range(runs)]
        new_hooks = [await create(a, delay=0, queue="hooks", payload={"g": i}) for i in range(runs)]
        wanted = [*new_jobs, *new_hooks, *dead]
        await until("new runs delivered", lambda: _all(states(wanted), "succeeded"), 90)
        drill.alive()
        handled = Counter(drill.handled())
        assert set(handled) == {*jobs, keyed, *new_jobs, *dead}
        assert set(handled.values()) == {1}, handled.most_common(3)  # each run once
        delivered = Counter(hooks)
        assert set(delivered) == {*hooked, *new_hooks}
        assert set(delivered.values()) == {1}, delivered.most_common(3)
        for name in ("scheduler", "worker", "webhook"):
            text = drill.logs[name].read_text()
            # The only tracebacks: the handler's own refusals (logged as failures).
            refusals = text.count("timewheel.errors.PermanentError: drill: refused")
            assert text.count("Traceback") == refusals, text[-3000:]
    finally:
        await http.aclose()
        await engine.close()
        drill.stop()


async def _all(values: Awaitable[list[str]], state: str) -> bool:
    return set(await values) == {state}


def _wipe(server: RedisServer) -> None:
    """kill -9, delete everything it stored, and start an empty server on its port."""
    server.kill()
    for path in server.data_dir.iterdir():
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    server.start()


async def test_disaster_drill_on_standalone_redis(
    own_redis: RedisServer,
    postgres_dsn: str,
    tmp_path: Path,
    receiver: tuple[str, list[str]],
) -> None:
    url, hooks = receiver
    drill = Drill(own_redis.url, postgres_dsn, tmp_path, url)
    await run_drill(drill, hooks, lambda: _wipe(own_redis))


@pytest.mark.cluster
async def test_disaster_drill_on_a_cluster(
    postgres_dsn: str, tmp_path: Path, receiver: tuple[str, list[str]]
) -> None:
    url, hooks = receiver
    cluster = RedisClusterServers(tmp_path / "cluster")
    state = {"cluster": cluster}

    def wipe() -> None:
        old = state["cluster"]
        for server in old.servers:
            server.kill()
        shutil.rmtree(old.data_dir)
        fresh = RedisClusterServers(old.data_dir)
        for new, was in zip(fresh.servers, old.servers, strict=True):
            new.port = was.port
        fresh.start()
        state["cluster"] = fresh

    with cluster:
        try:
            drill = Drill(cluster.url, postgres_dsn, tmp_path, url)
            await run_drill(drill, hooks, wipe, runs=8)
        finally:
            state["cluster"].stop()
