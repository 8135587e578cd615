"""The worker's parts that need no server: envelope decoding, the ack batcher, the read
plan across pairs, the failure log's rate limit, and the metrics' exposition."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

import pytest
import redis.asyncio as aioredis
import structlog
from prometheus_client import generate_latest

from timewheel.config import Settings
from timewheel.errors import RedisUnavailable, TimewheelError
from timewheel.runs.acks import AckBatcher, FailureBatcher
from timewheel.runs.delivery import Delivery, parse_entry, parse_fields
from timewheel.runs.failures import FailureLog, handler_name
from timewheel.runs.metrics import WorkerMetrics
from timewheel.runs.outcomes import FailResult, Failure
from timewheel.runs.signals import Retry
from timewheel.runs.worker import Worker
from timewheel.store.shard import Store

BASE = [
    b"run_id",
    b"01f0abc",
    b"task_id",
    b"01f0abc",
    b"tenant",
    b"acme",
    b"queue",
    b"jobs",
    b"attempt",
    b"2",
    b"due_ms",
    b"1800000000000",
    b"dispatched_ms",
    b"1800000000012",
    b"payload",
    b'{"n":1}',
]


@pytest.mark.parametrize(
    "extra",
    [
        [],
        [b"schedule_id", b"01fsched"],
        [b"visibility_timeout_ms", b"600"],
        [b"schedule_id", b"01fsched", b"visibility_timeout_ms", b"600"],
    ],
)
def test_fields_by_position_match_fields_by_name(extra: list[bytes]) -> None:
    fields = BASE + extra
    by_name = parse_entry("s", b"1-0", dict(zip(fields[::2], fields[1::2], strict=True)))
    assert parse_fields("s", b"1-0", fields) == by_name
    assert by_name.attempt == 2 and by_name.due_ms == 1_800_000_000_000
    assert by_name.schedule_id == ((b"01fsched" in extra and "01fsched") or None)
    assert by_name.visibility_timeout_ms == (600 if b"600" in extra else None)


def test_a_delivery_read_by_position_is_the_frozen_delivery_its_init_builds() -> None:
    """parse_fields sets Delivery's slots through their descriptors (its __init__ would
    set them through object.__setattr__): the result is the same frozen, hashable value."""
    fields = [*BASE, b"schedule_id", b"01fsched", b"visibility_timeout_ms", b"600"]
    parsed = parse_fields("s", b"1-0", fields)
    built = Delivery(
        "s", "1-0", "01f0abc", "01f0abc", "01fsched", "acme", "jobs", 2,
        1_800_000_000_000, 1_800_000_000_012, '{"n":1}', 600,
    )  # fmt: skip
    assert type(parsed) is Delivery
    assert parsed == built and hash(parsed) == hash(built)
    assert dataclasses.astuple(parsed) == dataclasses.astuple(built)
    with pytest.raises(dataclasses.FrozenInstanceError):
        parsed.attempt = 3  # type: ignore[misc]
    assert dataclasses.replace(parsed, attempt=3).attempt == 3


def test_fields_in_another_order_are_read_by_name() -> None:
    pairs = list(zip(BASE[::2], BASE[1::2], strict=True))[::-1]
    fields = [x for pair in pairs for x in pair]
    assert parse_fields("s", b"1-0", fields) == parse_fields("s", b"1-0", BASE)


def _delivery(n: int) -> Delivery:
    return Delivery("s", f"{n}-0", f"r{n}", f"r{n}", None, "acme", "jobs", 1, 0, 0, "{}")


async def test_acks_go_by_size_by_delay_and_within_the_pipelines_allowed() -> None:
    sent: list[list[str]] = []
    done: list[tuple[list[str], list[bool] | None]] = []
    release = asyncio.Event()

    async def send(batch: Sequence[Delivery]) -> list[bool]:
        sent.append([d.run_id for d in batch])
        await release.wait()
        return [True] * len(batch)

    def finished(
        batch: Sequence[Delivery], answers: list[bool] | None, error: TimewheelError | None
    ) -> None:
        done.append(([d.run_id for d in batch], answers))

    acks = AckBatcher(send, finished, batch=3, delay_s=0.05, max_in_flight=2)
    for n in range(3):
        acks.add(_delivery(n))
    await asyncio.sleep(0)
    assert sent == [["r0", "r1", "r2"]]  # a full batch goes at once
    acks.add(_delivery(3))
    await asyncio.sleep(0.01)
    assert len(sent) == 1  # one waits for the delay
    await asyncio.sleep(0.08)
    assert sent[1] == ["r3"]
    for n in range(4, 10):
        acks.add(_delivery(n))
    await asyncio.sleep(0.01)
    assert len(sent) == 2 and acks.waiting == 6  # two pipelines out: the rest waits
    release.set()
    await acks.close()
    assert [run for batch in sent for run in batch] == [f"r{n}" for n in range(10)]
    assert max(len(batch) for batch in sent) == 3
    assert sorted(run for batch, _ in done for run in batch) == sorted(f"r{n}" for n in range(10))
    assert all(answers is not None for _, answers in done)


async def test_a_shards_acks_go_together_once_a_call_is_full() -> None:
    sent: list[list[str]] = []

    async def send(batch: Sequence[Delivery]) -> list[bool]:
        sent.append([d.run_id for d in batch])
        return [True] * len(batch)

    def finished(
        batch: Sequence[Delivery], answers: list[bool] | None, error: TimewheelError | None
    ) -> None:
        pass

    def on(stream: str, n: int) -> Delivery:
        return dataclasses.replace(_delivery(n), stream=stream, run_id=f"{stream}{n}")

    acks = AckBatcher(
        send, finished, shard_of=lambda s: ord(s[0]), batch=8, per_call=3, delay_s=0.05
    )
    for n in range(2):
        acks.add(on("a", n))
        acks.add(on("b", n))
    acks.add(on("a", 2))  # a's third: a call of a's alone goes at once
    await asyncio.sleep(0)
    assert sent == [["a0", "a1", "a2"]] and acks.waiting == 2
    await asyncio.sleep(0.08)  # b's two wait out the delay, then go
    assert sent[1:] == [["b0", "b1"]] and acks.waiting == 0
    for n in range(8):  # a full shard goes on its own each time; others wait
        acks.add(on("c" if n % 4 else "d", n))
    await asyncio.sleep(0)
    assert sent[2:] == [["c1", "c2", "c3"], ["c5", "c6", "c7"]] and acks.waiting == 2
    for stream in "efghij":  # `batch` (8) waiting: everything goes in one pipeline
        acks.add(on(stream, 9))
    await asyncio.sleep(0)
    assert sent[4] == ["d0", "d4", "e9", "f9", "g9", "h9", "i9", "j9"] and acks.waiting == 0
    await acks.close()
    assert len(sent) == 5


async def test_failures_of_one_pass_go_together_and_each_caller_gets_its_answer() -> None:
    sent: list[list[str]] = []
    release = asyncio.Event()

    async def send(batch: Sequence[Failure]) -> list[FailResult]:
        sent.append([f.delivery.run_id for f in batch])
        await release.wait()
        return [FailResult("retry", due_ms=n) for n in range(len(batch))]

    fails = FailureBatcher(send, batch=3, delay_s=0)
    first = [asyncio.create_task(fails.fail(Failure(_delivery(n), "E"))) for n in range(2)]
    await asyncio.sleep(0.01)
    assert sent == [["r0", "r1"]]  # reported in one pass: one pipeline
    later = [asyncio.create_task(fails.fail(Failure(_delivery(n), "E"))) for n in range(2, 6)]
    await asyncio.sleep(0.01)
    assert len(sent) == 1  # one pipeline out at a time: the rest waits for it
    release.set()
    results = await asyncio.gather(*first, *later)
    assert sent == [["r0", "r1"], ["r2", "r3", "r4"], ["r5"]]
    assert [r.due_ms for r in results] == [0, 1, 0, 1, 2, 0]

    async def down(batch: Sequence[Failure]) -> list[FailResult]:
        raise RedisUnavailable("connection reset")

    broken = FailureBatcher(down, delay_s=0)
    outcomes = await asyncio.gather(
        *(broken.fail(Failure(_delivery(n), "E")) for n in range(2)), return_exceptions=True
    )
    assert all(isinstance(o, RedisUnavailable) for o in outcomes)


async def test_failures_wait_by_shard_like_acks() -> None:
    sent: list[list[str]] = []

    async def send(batch: Sequence[Failure]) -> list[FailResult]:
        sent.append([f.delivery.run_id for f in batch])
        return [FailResult("retry", due_ms=0) for _ in batch]

    def on(stream: str, n: int) -> Failure:
        d = dataclasses.replace(_delivery(n), stream=stream, run_id=f"{stream}{n}")
        return Failure(d, "E")

    fails = FailureBatcher(send, shard_of=lambda s: ord(s[0]), batch=8, per_call=2, delay_s=0.05)
    b = asyncio.create_task(fails.fail(on("b", 0)))
    a = [asyncio.create_task(fails.fail(on("a", n))) for n in range(2)]
    await asyncio.sleep(0.01)
    assert sent == [["a0", "a1"]]  # a's call is full: it goes; b's waits for the delay
    await asyncio.gather(*a)
    assert not b.done()
    assert (await b).outcome == "retry" and sent[1:] == [["b0"]]


async def test_a_failed_ack_pipeline_is_sent_again_then_reported() -> None:
    calls = 0
    done: list[tuple[list[bool] | None, TimewheelError | None]] = []

    async def flaky(batch: Sequence[Delivery]) -> list[bool]:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise RedisUnavailable("connection reset")
        return [False] * len(batch)

    def finished(
        batch: Sequence[Delivery], answers: list[bool] | None, error: TimewheelError | None
    ) -> None:
        done.append((answers, error))

    acks = AckBatcher(flaky, finished, batch=2, retry_pauses_s=(0.01, 0.01))
    acks.add(_delivery(1))
    acks.add(_delivery(2))
    await acks.close()
    assert calls == 3 and done == [([False, False], None)]

    async def down(batch: Sequence[Delivery]) -> list[bool]:
        raise RedisUnavailable("down")

    done.clear()
    acks = AckBatcher(down, finished, batch=1, retry_pauses_s=(0.01,))
    acks.add(_delivery(1))
    await acks.close()
    [(answers, error)] = done
    assert answers is None and isinstance(error, RedisUnavailable)


def _worker(pairs: list[tuple[str, str]], spread: int = 1) -> Worker:
    settings = Settings(prefix="u", shards=16, default_spread=spread)
    return Worker(Store(aioredis.Redis(), settings), pairs=pairs, concurrency=8, prefetch=8)


def test_one_pair_shares_the_room_between_its_streams() -> None:
    worker = _worker([("acme", "jobs")], spread=4)
    [(count, streams)] = worker._reader.plan(16)
    assert (count, len(streams)) == (4, 4)
    [(count, _)] = worker._reader.plan(5)
    assert count == 2  # rounded up: a read brings at most one run per stream more


def test_busy_pairs_share_the_room_and_idle_ones_are_probed_in_turn() -> None:
    worker = _worker([(f"t{i:02d}", "q") for i in range(20)])
    # Nothing known: all share, and 20 pairs over 16 runs of room hold one each at most.
    assert dict(worker._reader.plan(40)) == {1: worker.streams}
    for i, pair in enumerate(worker._reader.pairs):
        pair.busy = i < 2
    busy = {worker._reader.pairs[0].streams[0], worker._reader.pairs[1].streams[0]}
    seen: set[str] = set()
    for _ in range(4):
        plan = worker._reader.plan(12)
        probed = [s for count, streams in plan if count == 1 for s in streams if s not in busy]
        assert len(probed) <= 6  # within half the room
        shares = {s: count for count, streams in plan for s in streams if s in busy}
        assert shares and set(shares.values()) == {3}  # the other half, split equally
        seen.update(probed)
    assert seen == {p.streams[0] for p in worker._reader.pairs[2:]}  # every idle pair in turn


def test_a_busy_pair_reads_at_most_its_share_of_the_room() -> None:
    """8 slots and 8 read ahead, two busy pairs: each has 4 slots and 8 of the room. A
    pair holding 8 runs (held back, given to the runners, or running) is not read; one
    short of its share reads what is left of it; alone, a pair may take all of it."""
    worker = _worker([("slow", "q"), ("fast", "q")], spread=4)
    slow, fast = worker._reader.pairs
    slow.active = 8
    assert dict(worker._reader.plan(8)) == {1: fast.streams}  # ceil(4 / 4 streams)
    assert (slow.cap, fast.cap) == (4, 4)  # the handler slots, shared
    worker._reader.concurrency = worker._inflight.capacity = 32  # 16 of the room each
    slow.active = 16
    fast.active = 8  # 8 short of its share: 2 a stream, not the 4 of its share of 32
    assert dict(worker._reader.plan(32)) == {2: fast.streams}
    worker._reader.concurrency, worker._inflight.capacity = 8, 16
    fast.active = 8
    assert worker._reader.plan(8) == []  # both at their share: wait for a handler
    slow.busy = False  # the fast pair alone has work: no share (it holds 8 already)
    # half the room probes the idle pair's streams, the other half goes to the busy pair
    assert dict(worker._reader.plan(8)) == {1: fast.streams + slow.streams}
    assert (slow.cap, fast.cap) == (0, 0)
    many = _worker([(f"t{i}", "q") for i in range(3)])
    for pair in many._reader.pairs:
        pair.active = 6  # ceil(16 / 3): every pair at its share
    assert many._reader.plan(8) == []
    assert {p.cap for p in many._reader.pairs} == {3}  # ceil(8 slots / 3)


def test_the_runners_hold_back_a_pair_s_runs_past_its_share_of_the_slots() -> None:
    """A pair using its 4 slots gets no fifth: its next runs wait in `held` and take
    the slots its runs free, one for one; a larger share lets them go at once."""
    worker = _worker([("slow", "q"), ("fast", "q")])
    reader, runners = worker._reader, worker._runners
    slow, fast = reader.pairs
    reader.share_slots(2)
    runs = [dataclasses.replace(_delivery(i), stream=slow.streams[0]) for i in range(6)]
    runs.append(dataclasses.replace(_delivery(6), stream=fast.streams[0]))
    runners.take(runs, shared=True)
    assert [d.run_id for d in runners._buffer] == ["r0", "r1", "r2", "r3", "r6"]
    assert (slow.active, [d.run_id for d in slow.held], fast.active) == (4, ["r4", "r5"], 1)
    runners._pair_done(slow)  # one of its runs finished: the next takes its slot
    assert (slow.active, slow.outstanding, len(slow.held)) == (4, 5, 1)
    assert runners._buffer[-1].run_id == "r4"
    reader.share_slots(1)  # alone now: no share, the rest goes
    assert (slow.active, len(slow.held), runners._buffer[-1].run_id) == (5, 0, "r5")


def test_the_failure_log_keeps_to_its_rate() -> None:
    now = [0.0]
    failures = FailureLog("app:handler", per_s=5, clock=lambda: now[0])
    d = _delivery(1)
    with structlog.testing.capture_logs() as logs:
        logged = [failures.failed(d, ValueError("x"), "dead") for _ in range(20)]
        assert logged.count(True) == 5
        now[0] = 0.5  # 2.5 tokens back
        logged = [failures.failed(d, Retry(1.0, "busy"), "retry") for _ in range(5)]
        assert logged.count(True) == 2
    assert failures.suppressed_total == 18
    assert [e["log_level"] for e in logs] == ["error"] * 5 + ["warning"] * 2
    assert logs[5]["suppressed"] == 15  # the lines left out before it
    assert "exception" in logs[0] and "exception" not in logs[5]  # Retry: no stack
    assert logs[0]["handler"] == "app:handler"


def test_handler_names() -> None:
    import functools

    def plain(d: Delivery) -> None:
        return None

    class Callable:
        def __call__(self, d: Delivery) -> None:
            return None

    assert handler_name(plain).endswith("test_handler_names.<locals>.plain")
    assert handler_name(functools.partial(plain)) == handler_name(plain)
    assert handler_name(Callable()).endswith("Callable")


def test_metrics_exposition() -> None:
    metrics = WorkerMetrics()
    stats = metrics.pair("acme", "jobs")
    stats.acked += 3
    stats.duration.observe(0.001)  # on a bound: counted in its bucket (le)
    stats.duration.observe(0.2)
    stats.lag.observe(0.03)
    metrics.gauges = lambda: {"timewheel_worker_running_handlers": 2}
    text = generate_latest(metrics.registry).decode()
    labels = 'queue="jobs",tenant="acme"'
    assert f"timewheel_worker_acked_runs_total{{{labels}}} 3.0" in text
    assert f'timewheel_worker_handler_duration_seconds_bucket{{le="0.001",{labels}}} 1.0' in text
    assert f'timewheel_worker_handler_duration_seconds_bucket{{le="0.25",{labels}}} 2.0' in text
    assert f"timewheel_worker_handler_duration_seconds_count{{{labels}}} 2.0" in text
    assert f'timewheel_worker_start_lag_seconds_bucket{{le="0.025",{labels}}} 0.0' in text
    assert f'timewheel_worker_start_lag_seconds_bucket{{le="0.05",{labels}}} 1.0' in text
    assert "timewheel_worker_running_handlers 2.0" in text
    assert WorkerMetrics().registry is not metrics.registry  # no global state
