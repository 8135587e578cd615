"""The worker's loop on a real Redis: reading ahead while handlers run, acks only after a
handler returned, failures retried under overlap, plain functions on threads of their
own, several pairs served fairly, metrics, and failure logs with tracebacks."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import structlog
from prometheus_client import generate_latest

from timewheel.engine import Engine
from timewheel.models import Delivery
from timewheel.runs.worker import Worker
from timewheel.tasks.model import NewTask
from timewheel.testing.clock import NOW
from timewheel.testing.dispatch import prime, running_scheduler, tick_all, work_until


async def _until(done: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def _dispatched(engine: Engine, tenant: str, queue: str, count: int) -> list[str]:
    """`count` runs of (tenant, queue) created and dispatched at the test clock."""
    created = await engine.tasks.create_many(
        [NewTask(tenant=tenant, queue=queue, run_at_ms=NOW) for _ in range(count)]
    )
    while await tick_all(engine, NOW + 1, limit=5000):
        pass
    return [c.task_id for c in created]


def _sample(text: str, name: str, tenant: str, queue: str) -> float:
    """A pair's sample of a metric in Prometheus' text format."""
    prefix = f'{name}{{queue="{queue}",tenant="{tenant}"}} '
    [line] = [line for line in text.splitlines() if line.startswith(prefix)]
    return float(line.rsplit(" ", 1)[1])


async def _pending(engine: Engine, worker: Worker) -> int:
    total = 0
    for stream in worker.streams:
        info: Any = await engine.client.xpending(stream, worker.group)
        total += int(info["pending"])
    return total


async def test_runs_are_acked_only_after_their_handlers_return(fast: Engine) -> None:
    """While handlers block, the worker holds `concurrency` running runs plus `prefetch`
    read ahead, and none of them is acknowledged; each is acked once its handler returned."""
    await prime(fast)
    ids = await _dispatched(fast, "acme", "default", 30)
    gates: dict[str, asyncio.Event] = {i: asyncio.Event() for i in ids}
    started: list[str] = []
    returned: set[str] = set()

    async def handler(d: Delivery) -> None:
        started.append(d.run_id)
        await gates[d.run_id].wait()
        returned.add(d.run_id)

    worker = Worker(fast.store, "acme", "default", concurrency=5, prefetch=3)
    sent_early: list[str] = []
    send = worker._recorder.send_acks

    async def checked_send(batch: Any) -> list[bool]:
        sent_early.extend(d.run_id for d in batch if d.run_id not in returned)
        return await send(batch)

    worker._recorder.send_acks = checked_send  # type: ignore[method-assign]
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(handler, stop))
    try:
        await _until(lambda: len(started) == 5, 10, "handlers did not start")
        await asyncio.sleep(0.3)
        assert len(started) == 5  # concurrency
        assert await _pending(fast, worker) == 8  # 5 running + 3 read ahead
        states = {(await fast.tasks.get("acme", i)).state for i in ids}
        assert states == {"dispatched"}

        first = started[:2]
        for run_id in first:
            gates[run_id].set()
        await _until(lambda: worker.handled == 2, 10, "two acks")
        assert {(await fast.tasks.get("acme", i)).state for i in first} == {"succeeded"}
        others = [i for i in ids if i not in first]
        assert {(await fast.tasks.get("acme", i)).state for i in others} == {"dispatched"}
        await _until(lambda: len(started) == 7, 10, "two more started")
        assert await _pending(fast, worker) == 8  # refilled, still bounded

        for gate in gates.values():
            gate.set()
        await _until(lambda: worker.handled == 30, 20, "every run acked")
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    assert sent_early == []
    assert {(await fast.tasks.get("acme", i)).state for i in ids} == {"succeeded"}
    assert await _pending(fast, worker) == 0


async def test_failures_under_overlap_are_retried_by_the_policy(fast: Engine) -> None:
    options = {"retry": {"max_attempts": 3, "initial_s": 0.05, "jitter": "none"}}
    created = await fast.tasks.create_many(
        [NewTask(tenant="acme", delay_ms=0, options=options) for _ in range(200)]
    )
    flaky = {c.task_id for c in created[::2]}
    attempts: dict[str, list[int]] = {}

    async def handler(d: Delivery) -> None:
        attempts.setdefault(d.run_id, []).append(d.attempt)
        await asyncio.sleep(0.001)
        if d.run_id in flaky and d.attempt == 1:
            raise RuntimeError("first attempts of half the runs fail")

    worker = Worker(fast.store, "acme", "default", concurrency=20, tracebacks_per_s=0)
    async with running_scheduler(fast):
        await work_until(worker, handler, lambda: worker.handled == 200, 30)
    assert worker.failed == 100
    for c in created:
        want = [1, 2] if c.task_id in flaky else [1]
        assert attempts[c.task_id] == want, (c.task_id, attempts[c.task_id])
        task = await fast.tasks.get("acme", c.task_id)
        assert (task.state, task.attempt) == ("succeeded", want[-1])
    stats = worker.metrics.pair("acme", "default")
    assert (stats.acked, stats.failed, stats.retried, stats.dead) == (200, 100, 100, 0)
    assert stats.handled == 300


async def test_plain_functions_run_on_threads_bounded_by_concurrency(fast: Engine) -> None:
    created = await fast.tasks.create_many([NewTask(tenant="acme", delay_ms=0) for _ in range(24)])
    lock = threading.Lock()
    running, most, threads = 0, 0, set()

    def handler(d: Delivery) -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
            threads.add(threading.get_ident())
        time.sleep(0.05)  # blocks its thread, not the event loop
        with lock:
            running -= 1

    worker = Worker(fast.store, "acme", "default", concurrency=4)
    async with running_scheduler(fast):
        await work_until(worker, handler, lambda: worker.handled == 24, 20)
    assert most == 4
    assert len(threads) == 4 and threading.get_ident() not in threads
    states = {(await fast.tasks.get("acme", c.task_id)).state for c in created}
    assert states == {"succeeded"}


async def test_a_long_plain_function_keeps_its_lease(fast: Engine) -> None:
    created = await fast.tasks.create(
        NewTask(tenant="acme", delay_ms=0, options={"visibility_timeout_s": 0.6})
    )
    attempts: list[int] = []

    def slow(d: Delivery) -> None:
        attempts.append(d.attempt)
        time.sleep(1.8)  # three times the visibility timeout

    worker = Worker(fast.store, "acme", "default", concurrency=2)
    async with running_scheduler(fast) as scheduler:
        await work_until(worker, slow, lambda: worker.handled == 1, 15)
    assert attempts == [1] and scheduler.counters.reaped == 0
    task = await fast.tasks.get("acme", created.task_id)
    assert (task.state, task.attempt) == ("succeeded", 1)


async def test_a_busy_pair_does_not_starve_another(engine: Engine) -> None:
    """Two pairs, one with a backlog of 600 runs and one with 30: their runs start
    interleaved, so the small pair is done long before the backlog."""
    await prime(engine)
    await _dispatched(engine, "acme", "bulk", 600)
    await _dispatched(engine, "globex", "alerts", 30)
    order: list[str] = []

    async def handler(d: Delivery) -> None:
        order.append(d.tenant)
        await asyncio.sleep(0.002)

    worker = Worker(
        engine.store, pairs=[("acme", "bulk"), ("globex", "alerts")], concurrency=4, prefetch=4
    )
    await work_until(worker, handler, lambda: worker.handled == 630, 60)
    last_small = max(i for i, tenant in enumerate(order) if tenant == "globex")
    assert last_small < 150, last_small  # round robin: about 60; a FIFO of the backlog: 630


async def test_a_pair_that_wakes_up_among_idle_ones_is_read_soon(fast: Engine) -> None:
    """Twelve pairs, one busy: a run of one of the idle pairs starts within a few reads,
    while the busy pair's backlog is far from done."""
    pairs = [("acme", "bulk")] + [(f"t{i:02d}", "q") for i in range(11)]
    created = await fast.tasks.create_many(
        [NewTask(tenant="acme", queue="bulk", delay_ms=0) for _ in range(2000)]
    )
    order: list[str] = []

    async def handler(d: Delivery) -> None:
        order.append(d.tenant)
        await asyncio.sleep(0.001)

    worker = Worker(fast.store, pairs=pairs, concurrency=4, prefetch=4)
    stop = asyncio.Event()
    async with running_scheduler(fast):
        task = asyncio.create_task(worker.run(handler, stop))
        try:
            await _until(lambda: len(order) >= 200, 20, "the backlog did not start")
            late = await fast.tasks.create(NewTask(tenant="t07", queue="q", delay_ms=0))
            await _until(lambda: "t07" in order, 10, "the idle pair was never read")
            before = order.index("t07")
        finally:
            stop.set()
            await asyncio.wait_for(task, 20)
    assert before < 1000, before
    assert (await fast.tasks.get("t07", late.task_id)).state == "succeeded"
    assert len(created) == 2000


async def test_metrics_count_every_outcome(fast: Engine) -> None:
    once = {"retry": {"max_attempts": 1}}
    twice = {"retry": {"max_attempts": 2, "initial_s": 0.05}}
    ok = [await fast.tasks.create(NewTask(tenant="acme", delay_ms=0)) for _ in range(3)]
    doomed = await fast.tasks.create(
        NewTask(tenant="acme", delay_ms=0, payload_json='"doom"', options=once)
    )
    flaky = await fast.tasks.create(
        NewTask(tenant="acme", delay_ms=0, payload_json='"flaky"', options=twice)
    )

    async def handler(d: Delivery) -> None:
        await asyncio.sleep(0.01)
        if d.payload == "doom" or (d.payload == "flaky" and d.attempt == 1):
            raise ValueError(d.payload)

    worker = Worker(fast.store, "acme", "default", tracebacks_per_s=0)
    async with running_scheduler(fast):
        await work_until(worker, handler, lambda: worker.handled == 4 and worker.failed == 2, 20)
    text = generate_latest(worker.metrics.registry).decode()

    def value(name: str) -> float:
        return _sample(text, name, "acme", "default")

    assert value("timewheel_worker_handled_runs_total") == 6
    assert value("timewheel_worker_acked_runs_total") == 4
    assert value("timewheel_worker_failed_runs_total") == 2
    assert value("timewheel_worker_retried_runs_total") == 1
    assert value("timewheel_worker_dead_runs_total") == 1
    assert value("timewheel_worker_stale_outcomes_total") == 0
    assert value("timewheel_worker_handler_duration_seconds_count") == 6
    assert 0.05 <= value("timewheel_worker_handler_duration_seconds_sum") < 3
    assert value("timewheel_worker_start_lag_seconds_count") == 6
    lag_sum = value("timewheel_worker_start_lag_seconds_sum")
    assert 0 <= lag_sum < 6 * 2.0, lag_sum  # within the 1 s dispatch promise, plus the loop
    assert "timewheel_worker_running_handlers 0.0" in text
    assert "timewheel_worker_concurrency 10.0" in text
    states = {(await fast.tasks.get("acme", t.task_id)).state for t in [*ok, flaky]}
    assert states == {"succeeded"}
    assert (await fast.tasks.get("acme", doomed.task_id)).state == "dead"


@pytest.mark.parametrize("kind", ["async", "plain"])
async def test_failed_handlers_are_logged_with_tracebacks_rate_limited(
    fast: Engine, kind: str
) -> None:
    once = {"retry": {"max_attempts": 1}}
    await fast.tasks.create_many(
        [NewTask(tenant="acme", delay_ms=0, options=once) for _ in range(40)]
    )
    retried = await fast.tasks.create(
        NewTask(
            tenant="acme",
            delay_ms=0,
            payload_json='"again"',
            options={"retry": {"max_attempts": 2, "initial_s": 30}},
        )
    )

    def fail(d: Delivery) -> None:
        raise ValueError(f"no good: {d.payload}")

    async def fail_async(d: Delivery) -> None:
        fail(d)

    worker = Worker(fast.store, "acme", "default", concurrency=8, tracebacks_per_s=5)
    began = time.monotonic()
    with structlog.testing.capture_logs() as logs:
        async with running_scheduler(fast):
            await work_until(
                worker, fail_async if kind == "async" else fail, lambda: worker.failed == 41, 20
            )
    elapsed = time.monotonic() - began
    lines = [e for e in logs if e["event"] == "handler_failed"]
    assert 5 <= len(lines) <= 5 + 5 * elapsed + 1, (len(lines), elapsed)
    for line in lines:
        assert "Traceback (most recent call last)" in line["exception"]
        assert "ValueError: no good" in line["exception"]
        assert line["handler"].endswith("fail_async" if kind == "async" else "fail")
        want = ("warning", "retry") if line["run_id"] == retried.task_id else ("error", "dead")
        assert (line["log_level"], line["outcome"]) == want
    assert sum(e.get("suppressed", 0) for e in lines) + len(lines) <= 41
    assert worker._recorder.failures.suppressed_total == 41 - len(lines)
    assert any(e["event"] == "worker_started" for e in logs)
    assert any(e["event"] == "worker_stopped" for e in logs)


async def test_a_worker_makes_its_groups_again_when_its_streams_are_gone(fast: Engine) -> None:
    """As after a restore into an emptied Redis: the streams and their groups are gone;
    the worker finds out at its next read, makes them again and goes on."""
    handled: list[str] = []

    async def handler(d: Delivery) -> None:
        handled.append(d.run_id)

    worker = Worker(fast.store, "acme", "default")
    stop = asyncio.Event()
    async with running_scheduler(fast):
        task = asyncio.create_task(worker.run(handler, stop))
        try:
            first = await fast.tasks.create(NewTask(tenant="acme", delay_ms=0))
            await _until(lambda: worker.handled == 1, 10, "first run")
            for stream in worker.streams:
                await fast.client.delete(stream)
            second = await fast.tasks.create(NewTask(tenant="acme", delay_ms=0))
            await _until(lambda: worker.handled == 2, 15, "the worker did not recover")
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)
    assert handled == [first.task_id, second.task_id]


async def test_runs_read_while_heartbeats_go_out_keep_their_leases(fast: Engine) -> None:
    """Long handlers whose runs arrive one by one, while the lease keeper is extending
    other leases: every one keeps its lease (none is reaped, none runs twice)."""
    vt = {"visibility_timeout_s": 0.6}
    attempts: list[tuple[str, int]] = []

    async def slow(d: Delivery) -> None:
        attempts.append((d.run_id, d.attempt))
        await asyncio.sleep(1.2)  # twice the visibility timeout

    worker = Worker(fast.store, "acme", "default", concurrency=20)
    stop = asyncio.Event()
    async with running_scheduler(fast) as scheduler:
        task = asyncio.create_task(worker.run(slow, stop))
        try:
            for _ in range(15):
                await fast.tasks.create(NewTask(tenant="acme", delay_ms=0, options=vt))
                await asyncio.sleep(0.07)
            await _until(lambda: worker.handled == 15, 20, "runs not all handled")
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)
        assert scheduler.counters.reaped == 0
    assert len(attempts) == 15 and {a for _, a in attempts} == {1}


async def test_the_read_ahead_grows_for_fast_handlers_within_its_bound(fast: Engine) -> None:
    """Handlers that finish faster than reads come back let the worker read more at once,
    up to four times its prefetch, and never hold more than that."""
    await prime(fast)
    await _dispatched(fast, "acme", "default", 2000)
    most = 0

    async def quick(d: Delivery) -> None:
        nonlocal most
        most = max(most, worker._inflight.outstanding)

    worker = Worker(fast.store, "acme", "default", concurrency=4, prefetch=4)
    await work_until(worker, quick, lambda: worker.handled == 2000, 30)
    assert worker._reader.prefetch_now == 16
    assert most <= 4 + 16


async def test_a_slow_pair_does_not_take_every_handler_slot(engine: Engine) -> None:
    """One pair's handlers take a second each, another's none: the slow pair holds at most
    its share of the slots, so the fast pair's 200 runs are done in a few seconds rather
    than eight runs a second behind the slow ones."""
    await prime(engine)
    await _dispatched(engine, "slowco", "hooks", 60)
    await _dispatched(engine, "fastco", "hooks", 200)
    running = {"slowco": 0, "fastco": 0}
    most = {"slowco": 0, "fastco": 0}
    done = {"slowco": 0, "fastco": 0}

    async def handler(d: Delivery) -> None:
        running[d.tenant] += 1
        if done["fastco"] < 200:  # both pairs have work: shares apply
            most[d.tenant] = max(most[d.tenant], running[d.tenant])
        await asyncio.sleep(1.0 if d.tenant == "slowco" else 0)
        running[d.tenant] -= 1
        done[d.tenant] += 1

    worker = Worker(
        engine.store, pairs=[("slowco", "hooks"), ("fastco", "hooks")], concurrency=8, prefetch=8
    )
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(handler, stop))
    started = time.monotonic()
    try:
        await _until(lambda: most["slowco"] >= 4, 10, "the slow pair never took its share")
        text = generate_latest(worker.metrics.registry).decode()  # both pairs have work
        await _until(lambda: done["fastco"] == 200, 20, "the fast pair starved")
        fast_s = time.monotonic() - started
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)

    def gauge(name: str) -> float:
        return _sample(text, name, "slowco", "hooks")

    assert gauge("timewheel_worker_pair_slot_share") == 4
    assert gauge("timewheel_worker_pair_active_runs") == 4
    assert gauge("timewheel_worker_pair_held_runs") >= 1  # its read-ahead, waiting
    assert fast_s < 5, (fast_s, done)  # starved: 7-8 s, behind every slow run
    assert most["slowco"] <= 4, most  # its share of 8 slots between two busy pairs
    assert done["slowco"] >= 4  # and it kept its share meanwhile


async def test_plain_function_handlers_keep_to_their_share_too(standalone_engine: Engine) -> None:
    """The same with a plain function on handler threads: the slow pair's runs past its
    share wait in the worker, not in the threads' queue."""
    engine = standalone_engine
    await prime(engine)
    await _dispatched(engine, "slowco", "hooks", 40)
    await _dispatched(engine, "fastco", "hooks", 200)
    lock = threading.Lock()
    running = {"slowco": 0, "fastco": 0}
    most = {"slowco": 0, "fastco": 0}
    worker = Worker(
        engine.store, pairs=[("slowco", "hooks"), ("fastco", "hooks")], concurrency=8, prefetch=8
    )
    fast = worker.metrics.pair("fastco", "hooks")

    done = {"slowco": 0, "fastco": 0}

    def handler(d: Delivery) -> None:
        with lock:
            running[d.tenant] += 1
            if done["fastco"] < 150:  # the fast pair has runs waiting: shares apply
                most[d.tenant] = max(most[d.tenant], running[d.tenant])
        time.sleep(1.0 if d.tenant == "slowco" else 0)
        with lock:
            running[d.tenant] -= 1
            done[d.tenant] += 1

    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(handler, stop))
    started = time.monotonic()
    try:
        await _until(lambda: fast.acked == 200, 20, "the fast pair starved")
        fast_s = time.monotonic() - started
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    assert fast_s < 4, fast_s  # starved: 5 s, behind every slow run
    assert most["slowco"] <= 4, most
