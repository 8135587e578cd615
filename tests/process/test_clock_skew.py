"""Processes on a skewed or stepping wall clock (libfaketime), against a Redis and a test
on the true clock: what is due, when a scheduler's own timers fire and how long a
webhook waits for a Retry-After date follow Redis's (or the HTTP server's) clock alone."""

from __future__ import annotations

import asyncio
import email.utils
import itertools
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from timewheel.engine import Engine
from timewheel.models import Delivery
from timewheel.runs.worker import Worker
from timewheel.schedules.model import NewSchedule
from timewheel.schedules.spec import ScheduleSpec
from timewheel.sdk.client import Client
from timewheel.store.server import find_free_port
from timewheel.tasks.model import NewTask
from timewheel.testing.apiserver import start_api
from timewheel.testing.dispatch import all_deliveries, running_scheduler
from timewheel.testing.nodes import NodeProcess, settings_env
from timewheel.testing.schedules import events
from timewheel.testing.settings import test_settings
from timewheel.testing.skew import SkewedClock

TTL_MS = 1_000


def now_ms() -> int:
    return int(time.time() * 1000)


@pytest.fixture
async def engine(standalone_url: str) -> AsyncIterator[Engine]:
    settings = test_settings(
        standalone_url,
        shards=4,
        plan_horizon_ms=6_000,
        plan_interval_ms=500,
        misfire_ms=2_000,
        reap_interval_ms=250,
        poll_cap_ms=50,
    )
    eng = await Engine.connect(settings)
    try:
        yield eng
    finally:
        await eng.close()


def _node(engine: Engine, tmp_path: Path, clock: SkewedClock) -> NodeProcess:
    node = NodeProcess(engine.settings, "skewed", tmp_path, ttl_ms=TTL_MS, env=clock.env())
    node.wait_started()
    return node


@pytest.mark.timeout(120)
async def test_a_scheduler_30_s_ahead_reaps_and_plans_on_time_from_its_start(
    engine: Engine, tmp_path: Path
) -> None:
    # A schedule created just before the node starts: the node plans it from its first pass.
    sched, _ = await engine.schedules.create(
        NewSchedule(tenant="acme", spec=ScheduleSpec(every_s=1))
    )
    start = now_ms()
    crashed = await engine.tasks.create(
        NewTask(tenant="acme", delay_ms=0, queue="reaped", options={"visibility_timeout_s": 1})
    )
    reader = Worker(engine.store, "acme", "reaped")
    await reader.ensure_groups()
    node = _node(engine, tmp_path, SkewedClock(tmp_path / "clock", +30))
    try:
        first: list[int] = []
        deadline = time.monotonic() + 10
        while not first and time.monotonic() < deadline:
            # Read, never ack: the reader crashed; the reaper must retry after 1 s.
            first = [d.attempt for d in await reader.read(block_ms=200)]
        assert first == [1]
        read_at = now_ms()
        retried: list[Delivery] = []
        while not retried and time.monotonic() < deadline + 10:
            retried = await reader.read(block_ms=200)
        assert [d.attempt for d in retried] == [2]
        assert now_ms() - read_at < 4_000, "the reaper waited on the node's own clock"
        assert await reader.ack(retried[0])
        await asyncio.sleep(8)  # more than a plan horizon of fire times
    finally:
        node.stop()
    stop = now_ms()
    fires = sorted(d.due_ms for d in await all_deliveries(engine) if d.schedule_id == sched.id)
    expected = [f for f in fires if start + 1_000 <= f <= stop - 2_000]
    assert len(expected) >= 6
    # Every second from the first to the last: none skipped as a misfire.
    assert all(b - a == 1_000 for a, b in itertools.pairwise(expected))
    task = await engine.tasks.get("acme", crashed.task_id)
    assert (task.state, task.attempt) == ("succeeded", 2)


@pytest.mark.timeout(120)
async def test_a_scheduler_whose_clock_steps_back_and_forward_keeps_dispatching(
    engine: Engine, tmp_path: Path
) -> None:
    clock = SkewedClock(tmp_path / "clock", 0)
    node = _node(engine, tmp_path, clock)
    try:
        first = now_ms() + 500
        created = await engine.tasks.create_many(
            [NewTask(tenant="acme", payload_json="1", run_at_ms=first + 100 * i) for i in range(90)]
        )
        await asyncio.sleep(3)
        clock.set(-3600)  # one hour back
        await asyncio.sleep(3)
        # A create due at once still wakes the shard.
        late = await engine.tasks.create(NewTask(tenant="acme", delay_ms=0))
        clock.set(+30)  # and 30 s forward of the true time
        await asyncio.sleep(5)
    finally:
        node.stop()
    sent = {d.run_id: d for d in await all_deliveries(engine)}
    ids = [c.task_id for c in created] + [late.task_id]
    assert all(i in sent for i in ids), f"{sum(i not in sent for i in ids)} runs not sent"
    lags = [sent[i].dispatched_ms - sent[i].due_ms for i in ids]
    assert max(lags) < 1_000 and min(lags) >= 0


class _Hook(BaseHTTPRequestHandler):
    """Answers the first POST 503 with Retry-After: an HTTP date 5 s after its own Date
    (both on the true clock), and later ones 200; notes when each came."""

    seen: ClassVar[list[float]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.seen.append(time.time())
        if len(self.seen) == 1:
            now = time.time()
            self.send_response(503)
            self.send_header(
                "Retry-After", email.utils.formatdate(now + RETRY_AFTER_S, usegmt=True)
            )
            self.send_header("Date", email.utils.formatdate(now, usegmt=True))
        else:
            self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return


RETRY_AFTER_S = 5


@pytest.mark.timeout(120)
@pytest.mark.parametrize("skew_s", [+30, -3600])
async def test_the_webhook_honours_an_http_date_retry_after_on_a_skewed_node(
    engine: Engine, tmp_path: Path, skew_s: int
) -> None:
    _Hook.seen = []
    port = find_free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    clock = SkewedClock(tmp_path / "clock", skew_s)
    command = [sys.executable, "-m", "timewheel.cli", "webhook", "--url"]
    command += [f"http://127.0.0.1:{port}/hook", "--tenant", "acme", "--queue", "hooks"]
    command += ["--redis-url", engine.settings.redis_url]
    with (tmp_path / "webhook.log").open("wb") as log:
        hook = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**settings_env(engine.settings), **clock.env()},
        )
    try:
        created = await engine.tasks.create(
            NewTask(tenant="acme", queue="hooks", delay_ms=0, payload_json='{"n":1}')
        )
        async with running_scheduler(engine):
            deadline = time.monotonic() + 30
            while len(_Hook.seen) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
    finally:
        hook.terminate()
        hook.wait(timeout=15)
        server.shutdown()
        server.server_close()
    assert len(_Hook.seen) >= 2, (tmp_path / "webhook.log").read_text()
    waited = _Hook.seen[1] - _Hook.seen[0]
    assert RETRY_AFTER_S - 1 <= waited <= RETRY_AFTER_S + 2, waited
    task = await engine.tasks.get("acme", created.task_id)
    assert task.attempt == 2


@pytest.mark.timeout(120)
@pytest.mark.parametrize("skew_s", [+30, -3600])
async def test_schedules_created_through_a_skewed_api_fire_from_their_creation_on(
    standalone_url: str, tmp_path: Path, skew_s: int
) -> None:
    clock = SkewedClock(tmp_path / "clock", skew_s)
    proc, api = start_api(standalone_url, tmp_path / "api.log", env=clock.env())
    engine = await Engine.connect(api.settings)
    try:
        with Client(api.url, api.admin_key) as admin:
            admin.create_tenant("acme")
            key = admin.create_key("acme")["key"]
        with Client(api.url, key) as tw:
            made = [
                tw.create_schedule(every_s=1, catchup="all"),
                tw.create_schedule(cron="* * * * * *", catchup="all"),
                tw.create_schedule(every_s=10, catchup="skip"),
            ]
        async with running_scheduler(engine):
            await asyncio.sleep(4)
        sent = await all_deliveries(engine)
        for sid in (m["id"] for m in made):
            sched = await engine.schedules.get("acme", sid)
            fires = sorted(d.due_ms for d in sent if d.schedule_id == sid)
            # Nothing for a time before the schedule existed, nothing skipped.
            assert all(f > sched.created_ms for f in fires), (sid, fires, sched.created_ms)
            assert await events(engine, sid, "skipped") == []
            if sched.spec.every_s == 10:
                assert fires == []  # first due 10 s after creation
                assert sched.next_run_ms is not None
                assert 9_000 <= sched.next_run_ms - sched.created_ms <= 10_000
                continue
            assert 3 <= len(fires) <= 5, fires
            assert fires[0] - sched.created_ms <= 1_000
            assert all(b - a == 1_000 for a, b in itertools.pairwise(fires))
    finally:
        await engine.close()
        proc.terminate()
        proc.wait(timeout=15)
