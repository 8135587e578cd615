"""Executors: acks, retries with backoff, dead letters, leases and heartbeats, webhooks."""

from __future__ import annotations

import asyncio
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from timewheel.archive.history import run_history
from timewheel.engine import Engine
from timewheel.errors import PermanentError, TaskNotFound
from timewheel.models import Delivery
from timewheel.runs import dead_letters as deadletters
from timewheel.runs.webhook import WebhookExecutor
from timewheel.runs.worker import Worker
from timewheel.store.server import find_free_port
from timewheel.tasks.model import NewTask
from timewheel.testing.clock import NOW
from timewheel.testing.dispatch import prime, running_scheduler, tick_all, work_until
from timewheel.testing.settings import test_settings


async def test_fails_twice_then_succeeds_with_backoff_between_attempts(fast: Engine) -> None:
    policy = {"max_attempts": 5, "initial_s": 0.4, "factor": 2.0, "jitter": "proportional"}
    created = await fast.tasks.create(
        NewTask(tenant="acme", delay_ms=0, payload_json='"x"', options={"retry": policy})
    )
    starts: list[tuple[int, float]] = []

    async def flaky(d: Delivery) -> None:
        starts.append((d.attempt, time.monotonic()))
        assert d.run_id == created.task_id
        if d.attempt < 3:
            raise RuntimeError(f"flaky {d.attempt}")

    worker = Worker(fast.store, "acme", "default")
    async with running_scheduler(fast):
        await work_until(worker, flaky, lambda: worker.handled == 1, 15)
    assert [a for a, _ in starts] == [1, 2, 3]
    task = await fast.tasks.get("acme", created.task_id)
    assert (task.state, task.attempt, task.last_error) == ("succeeded", 3, "RuntimeError: flaky 2")
    history = await run_history(fast.store, "acme", created.task_id)
    assert [(e.kind, e.attempt) for e in history] == [
        ("created", None),
        ("dispatched", 1),
        ("retry_scheduled", 1),
        ("dispatched", 2),
        ("retry_scheduled", 2),
        ("dispatched", 3),
        ("acked", 3),
    ]
    retries = [e for e in history if e.kind == "retry_scheduled"]
    assert [e.error for e in retries] == ["RuntimeError: flaky 1", "RuntimeError: flaky 2"]
    for attempt, (event, (_, started), (_, next_start)) in enumerate(
        zip(retries, starts, starts[1:], strict=False), start=1
    ):
        base_ms = 400 * 2 ** (attempt - 1)
        due = await _retry_due(fast, created.task_id, attempt)
        # In whole ms: proportional jitter may land on exactly 0.8 x the backoff, which
        # 0.8 * 0.4 s in floating point (0.32000000000000006) would refuse.
        assert base_ms * 8 <= (due - event.at_ms) * 10 < base_ms * 12, (attempt, due - event.at_ms)
        delay_s = (due - event.at_ms) / 1000
        gap = next_start - started
        assert delay_s - 0.05 <= gap <= delay_s + 1.0, (attempt, gap, delay_s)


async def _retry_due(engine: Engine, run_id: str, attempt: int) -> int:
    shard = int(run_id[:3], 16)
    entries: Any = await engine.client.xrange(engine.keys.events(shard))
    for _, f in entries:
        if (f[b"e"], f.get(b"id"), f.get(b"attempt")) == (
            b"retry_scheduled",
            run_id.encode(),
            str(attempt).encode(),
        ):
            return int(f[b"due_ms"])
    raise AssertionError(f"no retry_scheduled event for attempt {attempt}")


async def test_exhausted_attempts_go_to_dead_letters_then_replay_and_purge(fast: Engine) -> None:
    options = {"retry": {"max_attempts": 2, "initial_s": 0.05}}
    doomed = await fast.tasks.create(
        NewTask(tenant="acme", delay_ms=0, payload_json='{"n":1}', options=options)
    )
    seen: list[int] = []
    succeed = False

    async def handler(d: Delivery) -> None:
        seen.append(d.attempt)
        if not succeed:
            raise ValueError("boom")

    worker = Worker(fast.store, "acme", "default")
    async with running_scheduler(fast):
        await work_until(worker, handler, lambda: worker.failed == 2, 10)
        assert seen == [1, 2]
        task = await fast.tasks.get("acme", doomed.task_id)
        assert (task.state, task.last_error) == ("dead", "ValueError: boom")
        dead, cursor = await deadletters.list_dead(fast.store, "acme")
        assert cursor is None and [d.run_id for d in dead] == [doomed.task_id]
        assert (dead[0].reason, dead[0].error, dead[0].attempt) == ("failed", "ValueError: boom", 2)
        assert dead[0].payload_json == '{"n":1}'
        # Another tenant cannot see, replay or purge it.
        assert (await deadletters.list_dead(fast.store, "globex"))[0] == []
        with pytest.raises(TaskNotFound):
            await deadletters.replay(fast.store, "globex", doomed.task_id)

        succeed = True
        await deadletters.replay(fast.store, "acme", doomed.task_id)
        await work_until(worker, handler, lambda: worker.handled == 1, 10)
        assert seen == [1, 2, 1]  # replayed: attempt counting starts again
        assert (await fast.tasks.get("acme", doomed.task_id)).state == "succeeded"
        assert (await deadletters.list_dead(fast.store, "acme"))[0] == []
        kinds = [e.kind for e in await run_history(fast.store, "acme", doomed.task_id)]
        assert kinds[-4:] == ["dead", "replayed", "dispatched", "acked"]

        permanent = await fast.tasks.create(NewTask(tenant="acme", delay_ms=0))

        async def refuse(d: Delivery) -> None:
            raise PermanentError("unknown customer")

        await work_until(worker, refuse, lambda: worker.failed == 3, 10)
    dead, _ = await deadletters.list_dead(fast.store, "acme")
    assert [(d.run_id, d.attempt) for d in dead] == [(permanent.task_id, 1)]
    await deadletters.purge(fast.store, "acme", permanent.task_id)
    assert (await deadletters.list_dead(fast.store, "acme"))[0] == []
    with pytest.raises(TaskNotFound):
        await fast.tasks.get("acme", permanent.task_id)
    with pytest.raises(TaskNotFound):
        await deadletters.purge(fast.store, "acme", permanent.task_id)


async def test_heartbeat_keeps_a_long_handler_s_lease(fast: Engine) -> None:
    created = await fast.tasks.create(
        NewTask(tenant="acme", delay_ms=0, options={"visibility_timeout_s": 0.6})
    )
    attempts: list[int] = []

    async def slow(d: Delivery) -> None:
        attempts.append(d.attempt)
        assert d.visibility_timeout_ms == 600
        await asyncio.sleep(1.8)  # three times the visibility timeout

    worker = Worker(fast.store, "acme", "default")
    async with running_scheduler(fast) as scheduler:
        await work_until(worker, slow, lambda: worker.handled == 1, 15)
        await asyncio.sleep(0.3)
    assert attempts == [1]
    assert scheduler.counters.reaped == 0
    task = await fast.tasks.get("acme", created.task_id)
    assert (task.state, task.attempt) == ("succeeded", 1)


async def test_a_run_past_expires_at_is_dead_lettered_not_dispatched(engine: Engine) -> None:
    await prime(engine)
    late = await engine.tasks.create(
        NewTask(tenant="acme", run_at_ms=NOW + 100, options={"expires_at_ms": NOW + 500}),
        now_ms=NOW,
    )
    fine = await engine.tasks.create(
        NewTask(tenant="acme", run_at_ms=NOW + 100, options={"expires_at_ms": NOW + 5000}),
        now_ms=NOW,
    )
    assert await tick_all(engine, NOW + 1000) == 1
    assert (await engine.tasks.get("acme", fine.task_id)).state == "dispatched"
    dead, _ = await deadletters.list_dead(engine.store, "acme")
    assert [(d.run_id, d.reason) for d in dead] == [(late.task_id, "expired")]
    assert (await engine.tasks.get("acme", late.task_id)).state == "dead"


class _Hooks(BaseHTTPRequestHandler):
    script: ClassVar[list[tuple[int, dict[str, str]]]] = []
    seen: ClassVar[list[tuple[float, dict[str, str], bytes]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        self.seen.append((time.monotonic(), {k.lower(): v for k, v in self.headers.items()}, body))
        status, headers = self.script[min(len(self.seen), len(self.script)) - 1]
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return


async def test_webhook_retries_500_and_503_with_retry_after_then_acks_200(fast: Engine) -> None:
    _Hooks.script = [(500, {}), (503, {"Retry-After": "1"}), (200, {})]
    _Hooks.seen = []
    port = find_free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), _Hooks)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    created = await fast.tasks.create(
        NewTask(
            tenant="acme",
            queue="hooks",
            delay_ms=0,
            payload_json='{"event":"paid"}',
            options={"retry": {"initial_s": 0.1, "jitter": "none"}},
        )
    )
    hook = WebhookExecutor(
        fast.store, "acme", "hooks", url=f"http://127.0.0.1:{port}/hook", timeout_s=5
    )
    try:
        async with running_scheduler(fast):
            await work_until(hook.worker, hook.deliver, lambda: hook.worker.handled == 1, 15)
    finally:
        await hook.aclose()
        server.shutdown()
        server.server_close()
    assert len(_Hooks.seen) == 3
    keys = {headers["idempotency-key"] for _, headers, _ in _Hooks.seen}
    assert keys == {created.task_id}
    assert [h["x-timewheel-attempt"] for _, h, _ in _Hooks.seen] == ["1", "2", "3"]
    assert {body for _, _, body in _Hooks.seen} == {b'{"event":"paid"}'}
    assert _Hooks.seen[2][0] - _Hooks.seen[1][0] >= 0.95  # Retry-After: 1 was honoured
    task = await fast.tasks.get("acme", created.task_id)
    assert (task.state, task.attempt) == ("succeeded", 3)


async def test_streams_stay_bounded_over_100000_acked_runs(standalone_url: str) -> None:
    engine = await Engine.connect(test_settings(standalone_url, shards=4))
    worker = Worker(engine.store, "bulk", "default", concurrency=200)
    longest = 0

    async def noop(d: Delivery) -> None:
        return

    try:
        async with running_scheduler(engine):
            stop = asyncio.Event()
            task = asyncio.create_task(worker.run(noop, stop))
            for _ in range(20):  # created while the worker consumes
                await engine.tasks.create_many([NewTask(tenant="bulk", delay_ms=0)] * 5000)
                longest = max(longest, sum([await engine.client.xlen(s) for s in worker.streams]))
            deadline = time.monotonic() + 90
            while worker.handled < 100_000:
                assert time.monotonic() < deadline, f"only {worker.handled} handled"
                longest = max(longest, sum([await engine.client.xlen(s) for s in worker.streams]))
                await asyncio.sleep(0.2)
            stop.set()
            await task
        lengths = [await engine.client.xlen(s) for s in worker.streams]
        assert lengths == [0] * len(lengths)
        memory = [await engine.client.memory_usage(s) or 0 for s in worker.streams]
        assert max(memory) < 64 * 1024, memory
        assert longest < 100_000  # it never held the whole run count
    finally:
        await engine.close()


async def test_reaper_pages_past_entries_with_longer_timeouts(fast: Engine) -> None:
    """Entries idle past the minimum but inside their own long timeout do not hide others."""
    await prime(fast, NOW)
    patient = [
        await fast.tasks.create(
            NewTask(tenant="acme", run_at_ms=NOW, options={"visibility_timeout_s": 3600}),
            now_ms=NOW,
        )
        for _ in range(600)
    ]
    # Due a millisecond later, so it is dispatched last: the 601st pending entry.
    hasty = await fast.tasks.create(
        NewTask(tenant="acme", run_at_ms=NOW + 1, options={"visibility_timeout_s": 0.2}), now_ms=NOW
    )
    shard = fast.store.shards_of("acme")[0]
    while (await fast.dispatch.tick(shard, now_ms=NOW + 1, limit=1000)).dispatched:
        pass
    worker = Worker(fast.store, "acme", "default", consumer="sleepy")
    got = await worker.read(count=1000, block_ms=100)
    assert len(got) == 601
    await asyncio.sleep(0.3)
    retried = 0
    for _ in range(3):  # 500 entries examined per call: the hasty one is in the 2nd page
        retried += (await fast.dispatch.reap(shard)).retried
    assert retried == 1
    assert (await fast.tasks.get("acme", hasty.task_id)).state == "scheduled"
    assert {(await fast.tasks.get("acme", p.task_id)).state for p in patient[:5]} == {"dispatched"}


async def test_reaper_passes_over_a_vanished_group_and_sees_it_made_again(fast: Engine) -> None:
    """A stream written again after its group went (a restore, a failover, a deleted
    stream) has no group until its worker next reads: the reaper must not fail the
    shard's whole call meanwhile (NOGROUP), and once the worker made the group again, a
    run it read and left expires as any other."""
    await prime(fast, NOW)
    shard = fast.store.shards_of("acme")[0]
    first = await fast.tasks.create(NewTask(tenant="acme", run_at_ms=NOW), now_ms=NOW)
    await tick_all(fast, NOW + 1)
    worker = Worker(fast.store, "acme", "default", consumer="sleepy")
    assert [d.run_id for d in await worker.read(count=10, block_ms=100)] == [first.task_id]
    for stream in worker.streams:
        await fast.client.delete(stream)  # the group goes with it; the registry keeps it
    second = await fast.tasks.create(
        NewTask(tenant="acme", run_at_ms=NOW + 2, options={"visibility_timeout_s": 0.2}),
        now_ms=NOW,
    )
    await tick_all(fast, NOW + 3)  # the tick writes the stream again, without a group
    assert (await fast.dispatch.reap(shard)).retried == 0
    # The worker's read loop makes its groups again on NOGROUP (ensure_groups).
    await worker.ensure_groups()
    got = await worker.read(count=10, block_ms=100)
    assert [d.run_id for d in got] == [second.task_id]
    await asyncio.sleep(0.3)
    assert (await fast.dispatch.reap(shard)).retried == 1
    assert (await fast.tasks.get("acme", second.task_id)).attempt == 1
    assert (await fast.tasks.get("acme", second.task_id)).state == "scheduled"
