"""A `timewheel worker` process killed with SIGKILL mid-run: its run is retried by
another executor once its lease expires."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

from timewheel.archive.history import run_history
from timewheel.engine import Engine
from timewheel.models import Delivery
from timewheel.runs.worker import Worker
from timewheel.tasks.model import NewTask
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
