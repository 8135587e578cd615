"""`timewheel worker` processes: one killed with SIGKILL mid-run or mid-batch (its runs
are retried by another executor once their leases expire), and `--processes N` (a
supervisor and N consumers of one group)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from timewheel.archive.history import run_history
from timewheel.engine import Engine
from timewheel.models import Delivery
from timewheel.runs.worker import Worker
from timewheel.store.server import find_free_port
from timewheel.tasks.model import NewTask
from timewheel.tenants import Limits, TenantStore
from timewheel.testing.dispatch import running_scheduler, work_until
from timewheel.testing.nodes import settings_env


async def test_a_killed_worker_s_run_is_retried_after_its_lease(
    fast: Engine, tmp_path: Path
) -> None:
    marker = tmp_path / "picked"
    created = await fast.tasks.create(
        NewTask(tenant="acme", queue="jobs", delay_ms=0, options={"visibility_timeout_s": 1.0})
    )
    env = {**settings_env(fast.settings), "TW_TEST_MARKER": str(marker)}
    log = (tmp_path / "worker.log").open("w")
    victim = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "timewheel.cli",
            "worker",
            "--app",
            "timewheel.testing.apps:sleepy",
            "--tenant",
            "acme",
            "--queue",
            "jobs",
            "--redis-url",
            fast.settings.redis_url,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    seen: list[Delivery] = []

    async def finish(d: Delivery) -> None:
        seen.append(d)

    try:
        async with running_scheduler(fast):
            deadline = time.monotonic() + 20
            while not marker.exists():
                assert time.monotonic() < deadline and victim.poll() is None, "never picked up"
                await asyncio.sleep(0.05)
            assert marker.read_text().split() == [created.task_id, "1"]
            victim.send_signal(signal.SIGKILL)
            victim.wait(10)
            rescuer = Worker(fast.store, "acme", "jobs", consumer="rescuer")
            await work_until(rescuer, finish, lambda: rescuer.handled == 1, 15)
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
        log.close()
    assert [(d.run_id, d.attempt) for d in seen] == [(created.task_id, 2)]
    task = await fast.tasks.get("acme", created.task_id)
    assert (task.state, task.attempt) == ("succeeded", 2)
    reasons = [
        e.reason
        for e in await run_history(fast.store, "acme", created.task_id)
        if e.kind == "retry_scheduled"
    ]
    assert reasons == ["lease_expired"]


def _worker_command(settings_url: str, *flags: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "timewheel.cli",
        "worker",
        "--app",
        "timewheel.testing.apps:note",
        "--redis-url",
        settings_url,
        "--log-json",
        *flags,
    ]


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for a parent that is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait(condition: Callable[[], bool], timeout_s: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}:\n{log.read_text()[-4000:]}"
        time.sleep(0.05)


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def _sample(text: str, name: str, **labels: str) -> float:
    """The value of a sample of the exposition text (0 if absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(f"{name}{{") or line.startswith(f"{name} "):
            head, value = line.rsplit(" ", 1)
            got = head[len(name) :].strip("{}")
            if ",".join(sorted(got.split(","))) == want or (not want and not got):
                return float(value)
    return 0.0


def _free_pair() -> int:
    """A free loopback port whose next port is free too (--processes 2 serves metrics on
    both), checked by binding it."""
    for _ in range(100):
        port = find_free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two free ports side by side on loopback")


async def test_processes_share_one_group_restart_a_dead_one_and_stop_together(
    fast: Engine, tmp_path: Path
) -> None:
    """--processes 2 over two tenants, one named and one found by a pattern: two consumers
    of one group share the runs, each serves its own metrics port, a consumer killed is
    replaced, SIGTERM stops them all."""
    runs = 120
    await TenantStore(fast.client, fast.keys).create_tenant("globex", Limits())
    for tenant in ("acme", "globex"):
        await fast.tasks.create_many(
            [NewTask(tenant=tenant, queue="jobs", delay_ms=0) for _ in range(runs // 2)]
        )
    port = _free_pair()
    notes, log_path = tmp_path / "notes", tmp_path / "supervisor.log"
    env = {**settings_env(fast.settings), "TW_TEST_LOG": str(notes), "TW_TEST_SLEEP_S": "0.01"}
    flags = ["--tenant", "acme", "--tenant", "glob*", "--queue", "jobs", "--processes", "2"]
    flags += ["--concurrency", "4", "--metrics-port", str(port)]
    with log_path.open("w") as log:
        parent = subprocess.Popen(
            _worker_command(fast.settings.redis_url, *flags), stdout=log, stderr=log, env=env
        )
    try:
        _wait(lambda: log_path.read_text().count("worker_started") == 2, 30, "no start", log_path)
        async with running_scheduler(fast):
            deadline = time.monotonic() + 30
            while not notes.exists() or len(notes.read_text().splitlines()) < runs:
                assert time.monotonic() < deadline, "runs not handled"
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)  # the last acks
        lines = [line.split() for line in notes.read_text().splitlines()]
        assert len({run_id for run_id, _, _ in lines}) == runs
        pids = {int(pid) for _, _, pid in lines}
        consumers = set(_children(parent.pid))
        assert pids <= consumers and len(consumers) == 2
        stream = fast.keys.stream(fast.store.shards_of("acme")[0], "acme", "jobs")
        group: Any = await fast.client.xinfo_consumers(stream, "timewheel")
        assert len({c["name"] for c in group}) == 2
        scraped = [_scrape(port), _scrape(port + 1)]
        for tenant in ("acme", "globex"):
            acked = sum(
                _sample(text, "timewheel_worker_acked_runs_total", tenant=tenant, queue="jobs")
                for text in scraped
            )
            assert acked == runs // 2, (tenant, acked)

        victim = sorted(consumers)[0]
        os.kill(victim, signal.SIGKILL)
        _wait(
            lambda: log_path.read_text().count("worker_started") == 3,
            20,
            "the killed consumer was not replaced",
            log_path,
        )
        assert "consumer_exited" in log_path.read_text()
        consumers = set(_children(parent.pid))
        assert len(consumers) == 2 and victim not in consumers

        parent.send_signal(signal.SIGTERM)
        assert parent.wait(40) == 0
        assert not any(_alive(pid) for pid in consumers)
        assert log_path.read_text().count("worker_stopped") == 2
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        for pid in _children(parent.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_consumers_stop_once_their_supervisor_is_gone(fast: Engine, tmp_path: Path) -> None:
    log_path = tmp_path / "supervisor.log"
    env = {**settings_env(fast.settings), "TW_TEST_LOG": str(tmp_path / "notes")}
    with log_path.open("w") as log:
        parent = subprocess.Popen(
            _worker_command(fast.settings.redis_url, "--tenant", "acme", "--processes", "2"),
            stdout=log,
            stderr=log,
            env=env,
        )
    consumers: list[int] = []
    try:
        _wait(lambda: log_path.read_text().count("worker_started") == 2, 30, "no start", log_path)
        consumers = _children(parent.pid)
        assert len(consumers) == 2
        parent.kill()
        parent.wait(10)
        _wait(
            lambda: not any(_alive(pid) for pid in consumers),
            10,
            "consumers outlived their supervisor",
            log_path,
        )
        assert log_path.read_text().count("supervisor_gone") == 2
        assert log_path.read_text().count("worker_stopped") == 2
    finally:
        for pid in consumers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_bad_app_fails_once_in_the_supervisor(fast: Engine, tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "timewheel.cli",
            "worker",
            "--app",
            "timewheel.testing.apps:missing",
            "--tenant",
            "acme",
            "--processes",
            "3",
            "--redis-url",
            fast.settings.redis_url,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        env=settings_env(fast.settings),
    )
    assert proc.returncode == 2
    assert proc.stderr.count("is not a function") == 1
    assert "worker_started" not in proc.stderr


async def test_a_worker_killed_mid_batch_loses_nothing(fast: Engine, tmp_path: Path) -> None:
    """A worker process holding handlers in flight, runs read ahead and acks not yet sent
    is killed: every run it had not finished is reaped and retried by another worker."""
    runs = 40
    created = await fast.tasks.create_many(
        [
            NewTask(tenant="acme", queue="jobs", delay_ms=0, options={"visibility_timeout_s": 1})
            for _ in range(runs)
        ]
    )
    notes, log_path = tmp_path / "notes", tmp_path / "victim.log"
    env = {**settings_env(fast.settings), "TW_TEST_LOG": str(notes), "TW_TEST_SLEEP_S": "0.15"}
    flags = ["--tenant", "acme", "--queue", "jobs", "--concurrency", "4", "--prefetch", "4"]
    with log_path.open("w") as log:
        victim = subprocess.Popen(
            _worker_command(fast.settings.redis_url, *flags), stdout=log, stderr=log, env=env
        )
    rescued: list[Delivery] = []

    async def finish(d: Delivery) -> None:
        rescued.append(d)

    try:
        async with running_scheduler(fast):
            deadline = time.monotonic() + 30
            while not notes.exists() or len(notes.read_text().splitlines()) < 8:
                assert time.monotonic() < deadline and victim.poll() is None, log_path.read_text()
                await asyncio.sleep(0.02)
            victim.send_signal(signal.SIGKILL)
            victim.wait(10)
            finished_by_victim = {line.split()[0] for line in notes.read_text().splitlines()}
            rescuer = Worker(fast.store, "acme", "jobs", consumer="rescuer")
            await work_until(
                rescuer,
                finish,
                lambda: len(finished_by_victim | {d.run_id for d in rescued}) >= runs,
                20,
            )
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
    states = {(await fast.tasks.get("acme", c.task_id)).state for c in created}
    assert states == {"succeeded"}
    retried = {d.run_id for d in rescued if d.attempt == 2}
    assert retried, "no run held by the victim was retried"
    for run_id in retried:
        reasons = [
            e.reason
            for e in await run_history(fast.store, "acme", run_id)
            if e.kind == "retry_scheduled"
        ]
        assert reasons == ["lease_expired"], (run_id, reasons)
    # The runs the victim had read but not finished came back; none was lost.
    assert {c.task_id for c in created} == finished_by_victim | {d.run_id for d in rescued}
