"""Crash tests (durability): SIGKILL at random moments, nothing acknowledged lost.

1. A client creates tasks continuously through a real `timewheel api` process while the
   redis-server under it is killed with SIGKILL at 5 random moments and restarted from
   its AOF (appendfsync always). Every create answered 2xx is present afterwards with its
   payload and due time, and a real `timewheel scheduler` dispatches each exactly once.
   Creates that failed are sent again, same body and idempotency key, until answered.
2. 20,000 tasks due over 12 s, two `timewheel scheduler` nodes and two `timewheel worker`
   processes, each kind killed with SIGKILL (and restarted) 4 times at random moments.
   Afterwards every task is succeeded (or dead, for the ones whose handler always fails:
   their retry policy), none missing, none stuck; runs handled twice are counted.
3. A write to a connection the dying redis-server had reset, under uvloop: a connection
   error (503), not uvloop's RuntimeError (500).

The moments come from a seeded RNG. The seed is printed and is part of every assertion
message; TW_CRASH_SEED=<seed> replays the same choices (the machine's timing still varies).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
import redis.exceptions
import uvloop

from timewheel.config import Settings
from timewheel.engine import Engine
from timewheel.errors import TaskNotFound
from timewheel.models import Task, ms_to_rfc3339
from timewheel.sdk.client import Client
from timewheel.store.connection import connect
from timewheel.store.server import RedisServer
from timewheel.tasks.model import NewTask
from timewheel.testing.apiserver import start_api
from timewheel.testing.dispatch import all_deliveries, stream_keys
from timewheel.testing.nodes import Fleet, NodeProcess, settings_env
from timewheel.testing.settings import test_settings

REPO = Path(__file__).resolve().parents[2]


def crash_seed() -> int:
    raw = os.environ.get("TW_CRASH_SEED")
    seed = int(raw) if raw else secrets.randbelow(2**32)
    print(f"crash test seed {seed} (TW_CRASH_SEED={seed} replays its random moments)")
    return seed


def now_ms() -> int:
    return int(time.time() * 1000)


async def get_many(engine: Engine, tenant: str, task_ids: Sequence[str]) -> dict[str, Task | None]:
    """engine.tasks.get for many ids, 500 at a time; None for a task that does not exist."""
    out: dict[str, Task | None] = {}
    for start in range(0, len(task_ids), 500):
        chunk = task_ids[start : start + 500]
        results = await asyncio.gather(
            *(engine.tasks.get(tenant, i) for i in chunk), return_exceptions=True
        )
        for task_id, result in zip(chunk, results, strict=True):
            if isinstance(result, TaskNotFound):
                out[task_id] = None
            elif isinstance(result, BaseException):
                raise result
            else:
                out[task_id] = result
    return out


# -- 1. the API and redis-server kill -9 ----------------------------------------------

TENANT_QUEUE = "crashq"
KILL_POINTS = 5


@dataclass
class Create:
    """One create the client wants acknowledged: sent again, same body, until a 2xx."""

    key: str
    run_at_ms: int
    payload: dict[str, Any]
    tries: int = 0

    def body(self) -> dict[str, Any]:
        return {
            "run_at": ms_to_rfc3339(self.run_at_ms),
            "idempotency_key": self.key,
            "queue": TENANT_QUEUE,
            "payload": self.payload,
        }


@dataclass
class Tally:
    """What the clients saw."""

    acked: dict[str, tuple[Create, str]] = field(default_factory=dict)
    """idempotency key -> (the create, the task id of its 2xx answer)"""
    statuses: Counter[int] = field(default_factory=Counter)
    transport_errors: int = 0
    found_existing: int = 0
    """Creates sent again after a failed try and answered 200 (the first try had been
    stored, its answer lost)."""
    unexpected: list[str] = field(default_factory=list)
    """Answers other than 2xx and 503 (a 500 is a bug)."""
    stale_503: list[str] = field(default_factory=list)
    """503s to requests sent while redis-server was up (after it answered PING, before
    the next kill)."""
    up_since: float | None = 0.0
    """monotonic time redis-server last answered after a (re)start; None while it is down."""
    kills: int = 0

    def ack(self, create: Create, status: int, task_id: str) -> None:
        if status == 200:
            if create.tries <= 1:
                self.unexpected.append(f"200 to the first try of fresh key {create.key}")
            self.found_existing += 1
        previous = self.acked.get(create.key)
        if previous is not None and previous[1] != task_id:
            self.unexpected.append(f"key {create.key}: task {previous[1]}, then {task_id}")
        self.acked[create.key] = (create, task_id)

    def take(
        self, resp: httpx.Response, todo: list[Create], *, batch: bool, redis_was_up: bool
    ) -> list[Create]:
        """Count an answer to `todo`; returns the creates still to send again."""
        self.statuses[resp.status_code] += 1
        if resp.status_code == 503:
            if resp.json()["error"]["code"] != "unavailable":
                self.unexpected.append(f"503 {resp.text[:300]}")
            if redis_was_up:
                self.stale_503.append(resp.json()["error"]["message"])
            return todo
        if resp.status_code not in (200, 201):
            self.unexpected.append(f"{resp.status_code} {resp.text[:300]}")
            return todo
        if not batch:
            self.ack(todo[0], resp.status_code, resp.json()["id"])
            return []
        left = []
        for create, item in zip(todo, resp.json()["results"], strict=True):
            if item["status"] in (200, 201):
                self.ack(create, item["status"], item["task"]["id"])
            else:
                self.unexpected.append(f"batch item {item}")
                left.append(create)
        return left

    def summary(self) -> str:
        return (
            f"{len(self.acked)} creates acknowledged, statuses {dict(self.statuses)}, "
            f"{self.transport_errors} transport errors, {self.found_existing} retried creates "
            f"answered 200, {len(self.stale_503)} 503s after Redis was back "
            f"{sorted(Counter(self.stale_503).items())[:3]}"
        )


async def produce(
    http: httpx.AsyncClient,
    tally: Tally,
    make: Callable[[], list[Create]],
    *,
    batch: bool,
    stop: asyncio.Event,
    deadline: float,
) -> None:
    """Send creates until `stop`; a failed one is sent again (same body) until answered."""
    todo: list[Create] = []
    while True:
        if not todo:
            if stop.is_set():
                return
            todo = make()
        assert time.monotonic() < deadline, f"creates never acknowledged: {todo[:3]}"
        up_since, kills_before = tally.up_since, tally.kills
        for create in todo:
            create.tries += 1
        try:
            if batch:
                body = {"tasks": [c.body() for c in todo]}
                resp = await http.post("/v1/tasks/batch", json=body)
            else:
                resp = await http.post("/v1/tasks", json=todo[0].body())
        except httpx.TransportError:
            tally.transport_errors += 1
            await asyncio.sleep(0.05)
            continue
        # Redis answered PING before this was sent, and no kill came since.
        redis_was_up = up_since is not None and tally.kills == kills_before
        todo = tally.take(resp, todo, batch=batch, redis_was_up=redis_was_up)
        if todo:
            await asyncio.sleep(0.05)


async def kill_redis_repeatedly(
    server: RedisServer, tally: Tally, rng: random.Random, points: int, seen: list[str]
) -> None:
    """SIGKILL redis-server at `points` random moments, restarting it from its AOF."""
    for point in range(1, points + 1):
        await asyncio.sleep(rng.uniform(0.4, 1.5))
        before = len(tally.acked)
        tally.up_since = None
        tally.kills += 1
        await asyncio.to_thread(server.kill)
        down_s = rng.uniform(0.1, 1.0)
        await asyncio.sleep(down_s)
        started = time.monotonic()
        await asyncio.to_thread(server.start)  # replays the AOF before it answers PING
        tally.up_since = time.monotonic()
        seen.append(
            f"kill {point} after {before} acknowledged creates: down {down_s:.2f} s, "
            f"restart took {tally.up_since - started:.2f} s"
        )


async def create_through_kills(
    api_url: str, key: str, server: RedisServer, rng: random.Random, seed: int, kills: list[str]
) -> Tally:
    """Six clients create continuously (4 single, 2 batches of 25) while redis-server is
    killed KILL_POINTS times; then each sends its failed creates again until answered."""
    tally = Tally()
    serial = itertools.count()

    def fresh() -> Create:
        n = next(serial)
        return Create(
            key=f"k{seed}-{n}",
            run_at_ms=now_ms() + rng.randint(1000, 3000),
            payload={"n": n, "seed": seed, "note": f"task {n} of the crash test"},
        )

    stop = asyncio.Event()
    deadline = time.monotonic() + 60
    async with httpx.AsyncClient(
        base_url=api_url, headers={"Authorization": f"Bearer {key}"}, timeout=15
    ) as http:
        running = [
            asyncio.create_task(
                produce(http, tally, lambda: [fresh()], batch=False, stop=stop, deadline=deadline)
            )
            for _ in range(4)
        ]
        running += [
            asyncio.create_task(
                produce(
                    http,
                    tally,
                    lambda: [fresh() for _ in range(25)],
                    batch=True,
                    stop=stop,
                    deadline=deadline,
                )
            )
            for _ in range(2)
        ]
        try:
            await kill_redis_repeatedly(server, tally, rng, KILL_POINTS, kills)
            await asyncio.sleep(1.0)  # creates go on against the restarted server
        finally:
            stop.set()
            await asyncio.gather(*running)
    return tally


async def check_stored(engine: Engine, tenant: str, acked: dict[str, Create], about: str) -> None:
    """Every acknowledged create is stored, with its payload, queue and due time."""
    stored = await get_many(engine, tenant, list(acked))
    missing = [i for i, t in stored.items() if t is None]
    assert not missing, f"{len(missing)} acknowledged creates lost: {missing[:10]} ({about})"
    for task_id, task in stored.items():
        assert task is not None
        want = acked[task_id]
        assert (json.loads(task.payload_json), task.due_ms, task.queue) == (
            want.payload,
            want.run_at_ms,
            TENANT_QUEUE,
        ), f"{task_id} ({about})"


async def check_dispatched_once(
    engine: Engine, tenant: str, acked: dict[str, Create], about: str
) -> list[int]:
    """Wait until every acknowledged run is in the ready stream; each must be there once,
    at its due time (never before), attempt 1. Returns the lateness of each, in ms."""
    wait_s = (max(c.run_at_ms for c in acked.values()) - now_ms()) / 1000 + 20
    deadline = time.monotonic() + wait_s
    while True:
        undelivered = set(acked) - {d.run_id for d in await all_deliveries(engine)}
        if not undelivered:
            break
        assert time.monotonic() < deadline, (
            f"{len(undelivered)} acknowledged runs never dispatched: "
            f"{sorted(undelivered)[:10]} ({about})"
        )
        await asyncio.sleep(0.25)
    await asyncio.sleep(0.5)  # a second dispatch would show up by now
    deliveries = await all_deliveries(engine)
    runs = Counter(d.run_id for d in deliveries)
    twice = {r: n for r, n in runs.items() if n > 1}
    assert not twice, f"runs dispatched more than once: {list(twice.items())[:10]} ({about})"
    ghosts = sorted((d.run_id, d.tenant, d.queue) for d in deliveries if d.run_id not in acked)
    assert not ghosts, f"runs nobody acknowledged (id, tenant, queue): {ghosts[:10]} ({about})"
    for d in deliveries:
        want = acked[d.run_id]
        assert (d.tenant, d.queue, d.attempt, d.due_ms, d.payload) == (
            tenant,
            TENANT_QUEUE,
            1,
            want.run_at_ms,
            want.payload,
        ), f"{d} ({about})"
        assert d.dispatched_ms >= d.due_ms, f"dispatched early: {d} ({about})"
    stored = await get_many(engine, tenant, list(acked))
    states = Counter(t.state if t else None for t in stored.values())
    assert states == {"dispatched": len(acked)}, f"{states} ({about})"
    return sorted(d.dispatched_ms - d.due_ms for d in deliveries)


async def test_api_creates_survive_kill_9_of_redis_server(tmp_path: Path) -> None:
    seed = crash_seed()
    rng = random.Random(seed)
    began = time.monotonic()
    server = RedisServer(tmp_path / "redis", appendfsync="always")
    server.start()
    api_proc, api = start_api(server.url, tmp_path / "api.log")
    node: NodeProcess | None = None
    engine: Engine | None = None
    kills: list[str] = []
    try:
        node = NodeProcess(api.settings, "crash-s1", tmp_path, ttl_ms=1000)
        node.wait_started()
        tenant = f"crash-{secrets.token_hex(3)}"
        with Client(api.url, api.admin_key) as admin:
            admin.create_tenant(tenant)
            key = admin.create_key(tenant)["key"]
        tally = await create_through_kills(api.url, key, server, rng, seed, kills)
        creating_s = time.monotonic() - began
        about = f"seed {seed}; {tally.summary()}; " + "; ".join(kills)
        print(about)
        assert not tally.unexpected, f"{tally.unexpected[:10]} ({about})"
        assert not tally.stale_503, f"503s while Redis was up ({about})"
        assert tally.statuses[503] + tally.transport_errors >= KILL_POINTS, about
        assert node.proc.poll() is None, f"the scheduler died:\n{node.log()[-3000:]}"
        acked = {task_id: create for create, task_id in tally.acked.values()}
        assert len(acked) == len(tally.acked), f"two keys answered with one task id ({about})"

        engine = await Engine.connect(api.settings)
        await check_stored(engine, tenant, acked, about)
        late = await check_dispatched_once(engine, tenant, acked, about)

        # The API reads them back too (after the last restart, every answer is a 200).
        async with httpx.AsyncClient(
            base_url=api.url, headers={"Authorization": f"Bearer {key}"}, timeout=15
        ) as http:
            for task_id in list(acked)[:: max(1, len(acked) // 200)]:
                resp = await http.get(f"/v1/tasks/{task_id}")
                assert resp.status_code == 200, f"{resp.status_code} {resp.text} ({about})"
                assert resp.json()["payload"] == acked[task_id].payload
        print(
            f"{len(acked)} tasks, each dispatched once; lateness p50 {late[len(late) // 2]} ms, "
            f"max {late[-1]} ms; creating took {creating_s:.1f} s, "
            f"all {time.monotonic() - began:.1f} s"
        )
    finally:
        if engine is not None:
            await engine.close()
        api_proc.terminate()
        api_proc.wait(timeout=20)
        if node is not None:
            node.stop()
        server.stop()
    api_log = (tmp_path / "api.log").read_text()
    assert "Traceback" not in api_log, api_log[-5000:]


# -- 2. scheduler nodes and workers kill -9 -------------------------------------------

TASKS = 20_000
SPREAD_MS = 12_000
DOOMED_EVERY = 200
"""Every 200th task's handler always fails: it ends dead by its retry policy (2 attempts)."""
LEASE_TTL_MS = 1000
VISIBILITY_S = 2.0
KILLS_EACH = 4
WORKER_CONCURRENCY = 100


class WorkerProcess:
    """A `timewheel worker --app timewheel.testing.crash_apps:record` subprocess and its files."""

    def __init__(self, settings: Settings, name: str, log_dir: Path, tenant: str, queue: str):
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self.runs_path = log_dir / f"{name}.runs"
        env = {
            **settings_env(settings),
            "TIMEWHEEL_DEFAULT_SPREAD": str(settings.default_spread),
            "TW_CRASH_LOG": str(self.runs_path),
        }
        with self.log_path.open("w") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "timewheel.cli",
                    "worker",
                    "--app",
                    "timewheel.testing.crash_apps:record",
                    "--tenant",
                    tenant,
                    "--queue",
                    queue,
                    "--concurrency",
                    str(WORKER_CONCURRENCY),
                    "--redis-url",
                    settings.redis_url,
                    "--log-json",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=REPO,
            )

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_started(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while "worker_started" not in self.log():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{self.name} did not start:\n{self.log()}")
            time.sleep(0.05)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                return self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                return self.proc.wait()
        return int(self.proc.returncode)


def handled_lines(log_dir: Path) -> list[tuple[str, int, str]]:
    """(run id, attempt, ok|fail) for every line every worker wrote."""
    out = []
    for path in sorted(log_dir.glob("*.runs")):
        for line in path.read_text().splitlines():
            run_id, attempt, outcome = line.split()
            out.append((run_id, int(attempt), outcome))
    return out


async def lease_expiries(engine: Engine) -> int:
    """How many attempts the reaper failed (retry_scheduled or dead, reason lease_expired)."""
    count = 0
    for shard in range(engine.settings.shards):
        entries: Any = await engine.client.xrange(engine.keys.events(shard))
        count += sum(1 for _, f in entries if f.get(b"reason") == b"lease_expired")
    return count


class Crew:
    """Two scheduler nodes (a Fleet) and two workers; any of them killed and replaced."""

    def __init__(self, settings: Settings, log_dir: Path, tenant: str, queue: str):
        self.settings, self.log_dir, self.tenant, self.queue = settings, log_dir, tenant, queue
        self.fleet = Fleet(settings, log_dir, ["a-1", "b-1"], ttl_ms=LEASE_TTL_MS)
        self.workers = {s: WorkerProcess(settings, f"{s}-1", log_dir, tenant, queue) for s in "wx"}

    def wait_started(self) -> None:
        for node in self.fleet.nodes.values():
            node.wait_started()
        for worker in self.workers.values():
            worker.wait_started()

    def kill_and_restart(self, kind: str, rng: random.Random, incarnation: int) -> str:
        """SIGKILL one scheduler node or worker (chosen by rng), start its successor under
        a new name and wait until it runs; returns the victim's name."""
        if kind == "scheduler":
            slot = rng.choice(sorted(self.fleet.nodes))
            node = self.fleet.nodes[slot]
            node.signal(signal.SIGKILL)
            node.proc.wait(10)
            successor = NodeProcess(
                self.settings, f"{slot[0]}-{incarnation}", self.log_dir, ttl_ms=LEASE_TTL_MS
            )
            self.fleet.nodes[slot] = successor
            successor.wait_started()
            return node.node_id
        slot = rng.choice(sorted(self.workers))
        worker = self.workers[slot]
        worker.proc.kill()
        worker.proc.wait(10)
        self.workers[slot] = WorkerProcess(
            self.settings, f"{slot}-{incarnation}", self.log_dir, self.tenant, self.queue
        )
        self.workers[slot].wait_started()
        return worker.name

    def died(self) -> list[str]:
        """Names of the current processes that exited on their own."""
        out = [n.node_id for n in self.fleet.nodes.values() if n.proc.poll() is not None]
        return out + [w.name for w in self.workers.values() if w.proc.poll() is not None]

    def stop(self) -> dict[str, int]:
        """SIGTERM everything; exit codes by name."""
        codes = {w.name: w.stop() for w in self.workers.values()}
        codes.update({n.node_id: n.stop() for n in self.fleet.nodes.values()})
        return codes


async def create_20000(engine: Engine, tenant: str, queue: str, first_due: int) -> list[str]:
    """TASKS tasks due evenly over SPREAD_MS from first_due; every DOOMED_EVERY-th is
    doomed (its handler fails; 2 attempts). Short visibility timeout and backoff."""
    doomed_policy = {"max_attempts": 2, "initial_s": 0.1, "jitter": "none"}
    policy = {
        "max_attempts": 25,
        "initial_s": 0.2,
        "factor": 1.5,
        "max_s": 1.0,
        "jitter": "proportional",
    }
    ids: list[str] = []
    for start in range(0, TASKS, 1000):
        batch = [
            NewTask(
                tenant=tenant,
                queue=queue,
                run_at_ms=first_due + i * SPREAD_MS // TASKS,
                payload_json=json.dumps({"n": i, "doomed": i % DOOMED_EVERY == 0}),
                options={
                    "visibility_timeout_s": VISIBILITY_S,
                    "retry": doomed_policy if i % DOOMED_EVERY == 0 else policy,
                },
            )
            for i in range(start, start + 1000)
        ]
        ids.extend(c.task_id for c in await engine.tasks.create_many(batch))
    assert len(set(ids)) == TASKS
    return ids


async def wait_finished(
    engine: Engine, tenant: str, ids: list[str], timeout_s: float, about: str
) -> dict[str, Task]:
    """Poll until every task is succeeded or dead; fail with the stragglers' states."""
    remaining = set(ids)
    final: dict[str, Task] = {}
    deadline = time.monotonic() + timeout_s
    while True:
        states = await get_many(engine, tenant, sorted(remaining))
        for task_id, task in states.items():
            if task is not None and task.state in ("succeeded", "dead"):
                final[task_id] = task
                remaining.discard(task_id)
        if not remaining:
            return final
        if time.monotonic() > deadline:
            by_state = Counter(t.state if t else "missing" for t in states.values())
            raise AssertionError(
                f"{len(remaining)} tasks not finished after {timeout_s} s: {dict(by_state)}, "
                f"e.g. {[(i, states[i]) for i in sorted(remaining)[:3]]} ({about})"
            )
        await asyncio.sleep(0.5)


async def test_scheduler_and_worker_kill_9_lose_no_task(tmp_path: Path) -> None:
    seed = crash_seed()
    rng = random.Random(seed)
    began = time.monotonic()
    server = RedisServer(tmp_path / "redis", appendfsync="always")
    server.start()
    settings = test_settings(
        server.url,
        shards=8,
        default_spread=8,  # the tenant's runs in every shard: both nodes dispatch them
        visibility_timeout_ms=2000,
        reap_interval_ms=200,
        retry_initial_ms=200,
        poll_cap_ms=50,
    )
    tenant, queue = "crash", "jobs"
    engine = await Engine.connect(settings)
    crew: Crew | None = None
    kills: list[str] = []
    try:
        crew = Crew(settings, tmp_path, tenant, queue)
        crew.wait_started()
        started_s = time.monotonic() - began
        first_due = now_ms() + 1500
        ids = await create_20000(engine, tenant, queue, first_due)
        doomed = {ids[i] for i in range(0, TASKS, DOOMED_EVERY)}

        # SIGKILL a scheduler node or a worker at random moments, restarting each.
        await asyncio.sleep(max(0.0, (first_due - now_ms()) / 1000 + 0.3))
        plan = ["scheduler"] * KILLS_EACH + ["worker"] * KILLS_EACH
        rng.shuffle(plan)
        for incarnation, kind in enumerate(plan, start=2):
            await asyncio.sleep(rng.uniform(0.2, 1.0))
            at_s = (now_ms() - first_due) / 1000
            done = len(handled_lines(tmp_path))
            victim = await asyncio.to_thread(crew.kill_and_restart, kind, rng, incarnation)
            kills.append(f"{kind} {victim} at {at_s:+.1f} s ({done} runs handled)")
        kills_s = time.monotonic() - began
        about = f"seed {seed}; kills: " + "; ".join(kills)

        final = await wait_finished(engine, tenant, ids, 50, about)
        settled_s = time.monotonic() - began
        assert not crew.died(), f"processes died on their own: {crew.died()} ({about})"
        exits = crew.stop()
        assert set(exits.values()) == {0}, f"exit codes {exits} ({about})"

        wrong = [
            (i, t.state, t.attempt, t.last_error)
            for i, t in final.items()
            if t.state != ("dead" if i in doomed else "succeeded")
        ]
        assert not wrong, f"{len(wrong)} tasks ended wrong: {wrong[:10]} ({about})"
        assert all(final[i].attempt <= 2 for i in doomed), about
        lines = handled_lines(tmp_path)
        ok = Counter(run_id for run_id, _, outcome in lines if outcome == "ok")
        never = set(ids) - doomed - set(ok)
        assert not never, f"succeeded, never handled: {sorted(never)[:10]} ({about})"
        assert not doomed & set(ok), about
        duplicates = sum(n - 1 for n in ok.values())
        leftovers = {k: n for k in await stream_keys(engine) if (n := await engine.client.xlen(k))}
        assert not leftovers, f"entries left in ready streams: {leftovers} ({about})"
        reaped = await lease_expiries(engine)
        print(
            f"{about}. {TASKS} tasks: {TASKS - len(doomed)} succeeded, {len(doomed)} dead by "
            f"policy; {len(lines)} handler runs, {duplicates} runs handled twice (ok), "
            f"{reaped} attempts failed by the reaper (lease_expired); processes up after "
            f"{started_s:.1f} s, kills done at {kills_s:.1f} s, all finished at {settled_s:.1f} s"
        )
    finally:
        if crew is not None:
            crew.stop()
        await engine.close()
        server.stop()


# -- 3. a connection closed under uvloop -----------------------------------------------


def test_a_write_to_a_reset_connection_on_uvloop_is_a_connection_error(tmp_path: Path) -> None:
    """The API runs on uvloop, which raises RuntimeError for a write to a transport a
    reset has closed (as when redis-server is killed under the API); timewheel's
    connections make that the ConnectionError (-> 503) it is. redis-py 8.2 finds the
    transport closed before it writes and raises that ConnectionError itself."""
    server = RedisServer(tmp_path / "redis")
    server.start()

    async def main() -> None:
        client = await connect(server.url)
        assert isinstance(client, aioredis.Redis)
        try:
            await client.ping()
            conn = await client.connection_pool.get_connection()  # type: ignore[no-untyped-call]
            writer = conn._writer
            assert writer is not None
            writer.transport.abort()  # what a reset from the peer leaves behind
            await asyncio.sleep(0.01)
            reset = r"handler is closed|closed by the server"
            with pytest.raises(redis.exceptions.ConnectionError, match=reset):
                await conn.send_packed_command(conn.pack_command("PING"), check_health=False)
            await client.connection_pool.release(conn)
            assert await client.ping()  # the pool connects afresh
        finally:
            await client.aclose()

    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main())
    finally:
        server.stop()
