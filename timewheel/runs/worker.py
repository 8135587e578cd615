"""Executor library: read (tenant, queue) pairs across their shards, run a handler, ack.

A handler gets a Delivery (run_id is the idempotency key: stable across retries and
redeliveries). Returning acks the run (state succeeded). Raising fails the attempt: the
`fail` script retries it after backoff or dead-letters it past max_attempts;
PermanentError dead-letters at once; `Retry(delay_s)` asks for a retry after that delay.
While a handler runs, the worker extends the run's lease (visibility timeout) by
heartbeat, so a long handler is not retried meanwhile; if the worker dies, the scheduler's
reaper retries the run once the lease expires.

How `run` keeps reading, handling and acknowledging going at once:

- **the reader** reads ahead: while handlers run it reads the next runs, as many as free
  handler slots plus `prefetch` (shared equally between the streams read and rounded up,
  so a read may bring one run per stream more), so the next batch is there when a slot
  frees. Once the streams were found empty it waits on all of them at once (BLOCK), which
  may bring one run per stream. Pairs are read round robin (below);
- **the runners**: `concurrency` of them, each taking the next run read (a coroutine
  each for an `async def` handler; a thread each for a plain function, so a blocking
  handler blocks nothing else), so a run costs no task and no thread hand-off of its own;
- **the acks** go out in pipelines (runs/acks.py) once the handler has returned: never
  before. Outcomes not yet recorded are bounded too: the reader waits when they pile up;
- **the lease keeper** extends the lease of every run read and not yet recorded, by
  heartbeat, and keeps the process's estimate of Redis's clock fresh (for the start lag).

A tenant's shards may grow while the worker runs (its limit `shards`: the streams of
every shard it has used are read, store/placement.py): the worker reads its tenants'
shards again every SHARDS_REFRESH_S and starts reading the new streams (its consumer
group made on each from the stream's start, so nothing already there is missed).

Several (tenant, queue) pairs share one worker fairly: each read gives every pair with
work an equal share of the free slots, and pairs that had nothing last time a small
probe, in an order that rotates; the runs of one read are interleaved across pairs.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import os
import queue as queues
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import redis.asyncio as aioredis
import structlog

from timewheel.config import Settings
from timewheel.errors import ConfigError, PermanentError, RedisUnavailable, TimewheelError
from timewheel.ids import validate_name
from timewheel.runs.acks import ACK_BATCH, ACK_DELAY_S, ACK_PIPELINES, AckBatcher, FailureBatcher
from timewheel.runs.delivery import Delivery, parse_entry
from timewheel.runs.failures import TRACEBACKS_PER_S, FailureLog, handler_name
from timewheel.runs.metrics import PairStats, WorkerMetrics
from timewheel.runs.outcomes import FailResult, Failure, Outcomes
from timewheel.runs.signals import Retry
from timewheel.runs.wire import Wire
from timewheel.store.connection import UNREACHABLE, torn_connection
from timewheel.store.shard import Store

log = structlog.get_logger("timewheel.worker")

DEFAULT_GROUP = "timewheel"

Handler = Callable[[Delivery], Awaitable[None]] | Callable[[Delivery], None]

READ_BLOCK_MS = 200
"""How long a read waits for new runs once the streams were found empty (and so how
long a stop may wait for the read in flight)."""
CLUSTER_POLL_S = 0.05
"""On a Cluster, the pause between reads of idle streams (one read per stream: a
blocking read of one would hold back the others)."""
LEASE_TICK_S = 0.05
CLOCK_CHECK_S = 1.0
"""How often the lease keeper looks at the clock estimate (it reads TIME when the
estimate is older than store/clock.py's SYNC_EVERY_S)."""
PREFETCH_GROWTH = 4
"""While handlers outpace the reads, the read-ahead grows up to this times `prefetch`."""
SHARDS_REFRESH_S = 2.0
"""How often the worker reads its tenants' shards again (new shards' streams are read
within about this long of a change)."""
UNACKED_BOUND = 1024
"""Runs handled whose outcome is not yet recorded, past which the reader waits (Redis
slower at recording than the handlers at handling)."""


def is_async_handler(handler: Callable[..., object]) -> bool:
    """An `async def` (also behind functools.partial, or as a callable's __call__)."""
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 - a callable object's method
    )


class _Pair:
    """One (tenant, queue) a worker serves: its streams and its stats."""

    __slots__ = ("busy", "queue", "stats", "streams", "tenant")

    def __init__(self, tenant: str, queue: str, streams: list[str], stats: PairStats) -> None:
        self.tenant = tenant
        self.queue = queue
        self.streams = streams
        self.stats = stats
        self.busy = True
        """Whether its last read filled a stream's count (so more is likely waiting)."""


async def _awaited(value: Awaitable[Any]) -> Any:
    return await value


class Worker:
    """Reads (tenant, queue) pairs from every shard stream of their tenants, as one consumer.

    `Worker(store, tenant, queue)` serves one pair; `pairs=[(tenant, queue), ...]` adds
    more (or gives them all, without `tenant`).
    """

    def __init__(
        self,
        store: Store,
        tenant: str | None = None,
        queue: str = "default",
        *,
        pairs: Iterable[tuple[str, str]] = (),
        group: str = DEFAULT_GROUP,
        consumer: str | None = None,
        concurrency: int = 10,
        prefetch: int | None = None,
        metrics: WorkerMetrics | None = None,
        ack_batch: int = ACK_BATCH,
        ack_delay_s: float = ACK_DELAY_S,
        ack_pipelines: int = ACK_PIPELINES,
        tracebacks_per_s: float = TRACEBACKS_PER_S,
    ) -> None:
        wanted = ([(tenant, queue)] if tenant is not None else []) + list(pairs)
        if not wanted:
            raise ConfigError("a worker needs a tenant (and queue), or pairs")
        self.store = store
        self.outcomes = Outcomes(store)
        self.group = validate_name(group, "group")
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}"
        self.concurrency = max(1, concurrency)
        self.prefetch = max(0, self.concurrency if prefetch is None else prefetch)
        self._prefetch_now = self.prefetch
        """The read-ahead now: from `prefetch` up to PREFETCH_GROWTH times it (_adapt)."""
        self._last_full = self._last_full_before = False
        """Whether the last read came back with all it asked for (and the one before)."""
        self._set_capacity()
        self.metrics = metrics or WorkerMetrics()
        self.metrics.gauges = self._gauges
        self._pairs: list[_Pair] = []
        self._stream_pair: dict[str, _Pair] = {}
        for t, q in dict.fromkeys(wanted):  # in order, without repeats
            t, q = validate_name(t, "tenant"), validate_name(q, "queue")
            streams = [store.keys.stream(s, t, q) for s in store.shards_of(t)]
            pair = _Pair(t, q, streams, self.metrics.pair(t, q))
            self._pairs.append(pair)
            self._stream_pair.update(dict.fromkeys(streams, pair))
        self.tenant, self.queue = self._pairs[0].tenant, self._pairs[0].queue
        self.pairs = [(p.tenant, p.queue) for p in self._pairs]
        self.streams = list(self._stream_pair)
        self.handled = 0
        """Runs whose ack Redis recorded."""
        self.failed = 0
        """Failed attempts Redis recorded (retried, dead-lettered or stale)."""
        self._ack_batch = ack_batch
        self._ack_delay_s = ack_delay_s
        self._ack_pipelines = ack_pipelines
        self._tracebacks_per_s = tracebacks_per_s
        client = store.client
        self._wire = (
            Wire(client, self.outcomes, self.group, self.consumer)
            if isinstance(client, aioredis.Redis)
            else None
        )
        """The bulk calls of runs/wire.py (standalone Redis only)."""
        self._groups_ready = False
        self._next_shards = 0.0
        """When the tenants' shards are read again (_refresh_shards)."""
        self._default_beat_s = self._beat_s(None)
        self._rotation = 0
        # -- what `run` keeps while it runs (all back to empty when it returns)
        self._leases: dict[str, dict[str, tuple[float, float]]] = {}
        self._next_beat = float("inf")
        self._buffer: deque[Delivery] = deque()
        self._inbox: queues.SimpleQueue[Delivery | None] = queues.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._finished: deque[tuple[Delivery, float, float, BaseException | None]] = deque()
        self._collect_pending = False
        self._idle: deque[asyncio.Future[None]] = deque()
        self._waking = 0
        self._outstanding = 0
        self._owned = 0
        self._running = 0
        self._draining = False
        self._reader_waiting: asyncio.Future[None] | None = None
        self._drained: asyncio.Future[None] | None = None
        self._failing: set[asyncio.Task[str]] = set()
        self._acks: AckBatcher | None = None
        self._fails: FailureBatcher | None = None
        self._failures = FailureLog("", tracebacks_per_s)
        self._offset_ms = 0.0

    # -- the steps, for an executor with its own loop ------------------------------------

    async def ensure_groups(self) -> None:
        """Create the consumer group on each stream (from its start, so nothing is missed)."""
        await self._refresh_shards()
        for stream in self.streams:
            await self.outcomes.register_group(stream, self.group)
        self._groups_ready = True

    async def _refresh_shards(self) -> None:
        """Read the tenants' shards again; add the streams of shards new to the worker,
        each with its consumer group made first."""
        self._next_shards = time.monotonic() + SHARDS_REFRESH_S
        tenants = list(dict.fromkeys(p.tenant for p in self._pairs))
        found = await self.store.placements.load_many(tenants, fresh=True)
        used = dict(zip(tenants, (p.used for p in found), strict=True))
        keys = self.store.keys
        added = [
            (pair, stream)
            for pair in self._pairs
            for stream in (keys.stream(s, pair.tenant, pair.queue) for s in used[pair.tenant])
            if stream not in self._stream_pair
        ]
        for pair, stream in added:
            if self._groups_ready:
                await self.outcomes.register_group(stream, self.group)
            pair.streams.append(stream)
            self._stream_pair[stream] = pair
        if added:
            self.streams = list(self._stream_pair)
            if self._groups_ready:  # a change while running (not the first read of them)
                log.info("worker_streams_added", streams=[s for _, s in added])

    async def _refresh_if_due(self) -> None:
        if time.monotonic() < self._next_shards:
            return
        try:
            await self._refresh_shards()
        except RedisUnavailable as exc:
            log.warning("shards_read_failed", error=str(exc))

    async def read(self, count: int = 100, block_ms: int = 1000) -> list[Delivery]:
        """New deliveries for this consumer (up to `count` per stream), waiting up to
        block_ms when there are none."""
        if not self._groups_ready:
            await self.ensure_groups()
        await self._refresh_if_due()
        replies = await self._read_streams([(count, self.streams)], block_ms)
        return [d for _, _, got in replies for d in got]

    async def ack(self, delivery: Delivery) -> bool:
        """Mark a delivery done (state succeeded). False if the run had moved on."""
        return await self.outcomes.ack(delivery, self.group)

    async def fail(
        self,
        delivery: Delivery,
        error: str,
        *,
        permanent: bool = False,
        delay_s: float | None = None,
    ) -> str:
        """Fail this attempt; returns 'retry', 'dead' or 'stale'."""
        delay_ms = None if delay_s is None else max(0, round(delay_s * 1000))
        res = await self.outcomes.fail(
            delivery, self.group, error, permanent=permanent, delay_ms=delay_ms
        )
        return res.outcome

    def heartbeat_interval_s(self, delivery: Delivery) -> float:
        """A third of the run's visibility timeout: two heartbeats may be lost safely."""
        return self._beat_s(delivery.visibility_timeout_ms)

    def _beat_s(self, timeout_ms: int | None) -> float:
        timeout = timeout_ms or self.store.settings.visibility_timeout_ms
        return max(0.05, timeout / 3000.0)

    async def handle(self, handler: Handler, delivery: Delivery) -> str:
        """Run the handler on one delivery, its lease kept by heartbeat while `run`'s
        lease keeper runs; then ack or fail it, one call each.

        Returns acked, retry, dead, stale, or unrecorded (Redis did not take the outcome:
        the entry stays pending and the reaper retries the run once its lease expires).
        """
        self._hold([delivery], time.monotonic())
        stats = self._stream_pair[delivery.stream].stats
        if self._acks is None:  # not inside `run`: failures are logged under this handler
            self._failures = FailureLog(handler_name(handler), self._tracebacks_per_s)
        try:
            try:
                if is_async_handler(handler):
                    await handler(delivery)  # type: ignore[misc]
                else:
                    result = await asyncio.to_thread(handler, delivery)
                    if inspect.isawaitable(result):
                        await result
            except Exception as exc:
                stats.handled += 1
                return await self._record_failure(delivery, exc)
            stats.handled += 1
            try:
                await self.ack(delivery)
            except TimewheelError as exc:
                log.warning("outcome_not_recorded", run_id=delivery.run_id, error=str(exc))
                stats.unrecorded += 1
                return "unrecorded"
            stats.acked += 1
            self.handled += 1
            return "acked"
        finally:
            self._release(delivery)

    # -- reading -------------------------------------------------------------------------

    async def _read_streams(
        self, plan: Sequence[tuple[int, list[str]]], block_ms: int | None
    ) -> list[tuple[str, int, list[Delivery]]]:
        """(stream, count asked, deliveries) for every stream that had some. Each item of
        `plan` is a count per stream and the streams to read with it; only a plan of one
        item blocks (one XREADGROUP per item, or per stream on a Cluster)."""
        reads: list[tuple[int, list[str]]]
        if self._wire is None:  # a Cluster: each stream is its own slot, one call each
            reads = [(count, [s]) for count, streams in plan for s in streams]
        else:
            reads = list(plan)
        block = block_ms if len(reads) == 1 else None
        try:
            if len(reads) == 1:
                replies = [await self._xreadgroup(*reads[0], block)]
            else:
                replies = await asyncio.gather(*(self._xreadgroup(c, s, None) for c, s in reads))
        except UNREACHABLE as exc:
            raise RedisUnavailable(f"read failed: {exc}") from exc
        except (AttributeError, TypeError) as exc:
            if not torn_connection(exc):
                raise
            raise RedisUnavailable(f"read failed: connection lost ({exc})") from exc
        return [
            (stream, count, got)
            for (count, _), reply in zip(reads, replies, strict=True)
            for stream, got in reply
        ]

    async def _xreadgroup(
        self, count: int, streams: list[str], block_ms: int | None
    ) -> list[tuple[str, list[Delivery]]]:
        if self._wire is not None:
            return await self._wire.read(count, streams, block_ms)
        wanted: dict[Any, Any] = dict.fromkeys(streams, ">")
        reply: Any = await self.store.client.xreadgroup(
            self.group, self.consumer, wanted, count=count, block=block_ms
        )
        items = reply.items() if isinstance(reply, dict) else reply or []  # RESP3 or RESP2
        out: list[tuple[str, list[Delivery]]] = []
        for name, entries in items:
            if entries:
                stream = name.decode() if isinstance(name, bytes) else name
                out.append((stream, [parse_entry(stream, e, f) for e, f in entries]))
        return out

    def _plan(self, room: int) -> list[tuple[int, list[str]]]:
        """What to read for `room` runs: (count per stream, streams) items.

        Pairs whose last read filled a stream's count (busy) share the room equally. The
        others are probed with one run per stream: as many as fit in half the room (at
        least one pair), taken round robin from where the last read's probes stopped.
        With no pair busy, all share."""
        pairs = self._pairs
        if len(pairs) == 1:
            streams = pairs[0].streams
            return [(-(-room // len(streams)), streams)]
        busy = [p for p in pairs if p.busy]
        probes: list[str] = []
        if not busy:
            busy = pairs
        elif len(busy) < len(pairs):
            budget, start, n = room // 2, self._rotation, len(pairs)
            for step in range(n):
                i = (start + step) % n
                p = pairs[i]
                if p.busy:
                    continue
                if probes and len(probes) + len(p.streams) > budget:
                    break
                probes.extend(p.streams)
                self._rotation = (i + 1) % n
        share = max(1, (room - len(probes)) // len(busy))
        by_count: dict[int, list[str]] = {}
        for p in busy:
            by_count.setdefault(max(1, -(-share // len(p.streams))), []).extend(p.streams)
        if probes:
            by_count.setdefault(1, []).extend(probes)
        return list(by_count.items())

    def _learn(
        self, plan: Sequence[tuple[int, list[str]]], got: Sequence[tuple[str, int, Any]]
    ) -> None:
        """Mark the pairs read: busy if one of their streams gave its whole count."""
        if len(self._pairs) == 1:
            return
        for _, streams in plan:
            for s in streams:
                self._stream_pair[s].busy = False
        for stream, count, deliveries in got:
            if len(deliveries) >= count:
                self._stream_pair[stream].busy = True

    def _interleave(self, got: list[tuple[str, int, list[Delivery]]]) -> list[Delivery]:
        """The runs of one read, alternating between pairs (and streams)."""
        if len(got) == 1:
            return got[0][2]
        if len({self._stream_pair[s] for s, _, _ in got}) == 1:
            return [d for _, _, ds in got for d in ds]
        return [d for row in itertools.zip_longest(*(ds for _, _, ds in got)) for d in row if d]

    def _set_capacity(self) -> None:
        self._capacity = self.concurrency + self._prefetch_now
        self._held_bound = self._capacity + UNACKED_BOUND
        self._read_min = max(1, self._capacity // 4)
        """The reader waits until this many runs may be read (or nothing is in flight)."""

    def _adapt(self, asked: int, got: int) -> None:
        """Size the read-ahead from what a read found when it came back.

        Two reads in a row that came back full, the second finding handler slots idle:
        the handlers finished the first read's runs before the second arrived, so read
        more at once (fewer, larger reads are cheaper for Redis, which fsyncs once per
        pass of its event loop). Runs read ahead still waiting for a slot: read less,
        down to `prefetch`. Handlers that keep their slots busy never grow it."""
        full, self._last_full = got >= asked, got >= asked
        if not self.prefetch:
            return
        running = min(self._outstanding, self.concurrency) if self._threads else self._running
        waiting = self._outstanding - running
        now = self._prefetch_now
        if full and self._last_full_before and self._outstanding < self.concurrency:
            now = min(now * 2, self.prefetch * PREFETCH_GROWTH)
        elif 2 * waiting >= now:
            now = max(self.prefetch, now // 2)
        if now != self._prefetch_now:
            self._prefetch_now = now
            self._set_capacity()

    def _room(self) -> int:
        """Runs the reader may read now: free handler slots plus the prefetch, within the
        bound on runs held (read and not yet recorded)."""
        return min(self._capacity - self._outstanding, self._held_bound - self._owned)

    async def _read_loop(self, stop: asyncio.Event) -> None:
        found = True
        while not stop.is_set():
            room = self._room()
            if room < self._read_min and (self._outstanding or room <= 0):
                await self._wait_for_room()
                continue
            if not found:  # the streams were empty: wait on all of them at once
                plan = [(max(1, room // len(self.streams)), self.streams)]
            else:
                plan = self._plan(room)
            block = READ_BLOCK_MS if not found else None
            self._last_full_before = self._last_full
            try:
                if not self._groups_ready:
                    await self.ensure_groups()
                got = await self._read_streams(plan, block)
                await self._refresh_if_due()
            except RedisUnavailable as exc:
                if "NOGROUP" in str(exc):  # streams gone (a restore, a flush): make them again
                    self._groups_ready = False
                log.warning("read_failed", error=str(exc))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.5)
                continue
            self._learn(plan, got)
            self._adapt(room, sum(len(ds) for _, _, ds in got))
            if got:
                self._accept(self._interleave(got))
            elif not found and self.store.is_cluster and len(self.streams) > 1:
                # Reads of several Cluster streams do not block: pause between polls.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), CLUSTER_POLL_S)
            found = bool(got)

    async def _wait_for_room(self) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._reader_waiting = waiter
        try:
            await waiter
        finally:
            self._reader_waiting = None

    def _wake_reader(self) -> None:
        waiter = self._reader_waiting
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _hold(self, deliveries: Sequence[Delivery], now: float) -> None:
        """Keep the leases of runs just read (the lease keeper extends them)."""
        leases, default = self._leases, self._default_beat_s
        usual = (now + default, default)
        earliest = min(self._next_beat, usual[0])
        for d in deliveries:
            lease = usual
            if d.visibility_timeout_ms is not None:
                beat = self._beat_s(d.visibility_timeout_ms)
                lease = (now + beat, beat)
                earliest = min(earliest, lease[0])
            entries = leases.get(d.stream)
            if entries is None:
                entries = leases[d.stream] = {}
            entries[d.entry_id] = lease
        self._next_beat = earliest
        self._owned += len(deliveries)

    def _release(self, delivery: Delivery) -> None:
        """The run's outcome is recorded (or given up on): its lease is no longer ours."""
        entries = self._leases.get(delivery.stream)
        if entries is not None and entries.pop(delivery.entry_id, None) is not None:
            self._owned -= 1
            if self._reader_waiting is not None and self._room() >= self._read_min:
                self._wake_reader()

    def _accept(self, deliveries: list[Delivery]) -> None:
        """Runs read: hold their leases and give them to the runners."""
        self._hold(deliveries, time.monotonic())
        self._outstanding += len(deliveries)
        if self._threads:
            put = self._inbox.put
            for d in deliveries:
                put(d)
        else:
            self._buffer.extend(deliveries)
            if self._idle and not self._waking:
                self._wake_runner()

    def _handler_done(self) -> None:
        """A handler returned or raised: its slot is free."""
        self._outstanding -= 1
        if self._reader_waiting is not None and self._room() >= self._read_min:
            self._wake_reader()
        if self._draining and not self._outstanding:
            self._handler_done_draining()

    def _handler_done_draining(self) -> None:
        """Stopping, the last run held finished: the drain may go on."""
        drained = self._drained
        if drained is not None and not drained.done():
            drained.set_result(None)

    # -- the runners ---------------------------------------------------------------------

    def _wake_runner(self) -> None:
        while self._idle:
            waiter = self._idle.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._waking += 1
                return

    def _start_lag_s(self, delivery: Delivery, start: float) -> float:
        """Handler start minus due, on the Redis clock estimate (never before dispatch)."""
        redis_ms = max(start * 1000.0 + self._offset_ms, delivery.dispatched_ms)
        return (redis_ms - delivery.due_ms) / 1000.0

    async def _runner(self, handler: Callable[[Delivery], Awaitable[None]]) -> None:
        """One handler slot: takes the next run read until the worker drains."""
        buffer, idle, pair_of, acks = self._buffer, self._idle, self._stream_pair, self._acks
        assert acks is not None
        loop = asyncio.get_running_loop()
        monotonic = time.monotonic
        while True:
            if not buffer:
                if self._draining:
                    return
                waiter = loop.create_future()
                idle.append(waiter)
                try:
                    await waiter
                finally:
                    if waiter.done() and not waiter.cancelled():
                        self._waking -= 1
                continue
            d = buffer.popleft()
            if buffer and idle and not self._waking:
                self._wake_runner()
            stats = pair_of[d.stream].stats
            start = monotonic()
            redis_ms = start * 1000.0 + self._offset_ms  # _start_lag_s, inline
            stats.lag.observe((max(redis_ms, d.dispatched_ms) - d.due_ms) / 1000.0)
            self._running += 1
            try:
                await handler(d)
            except Exception as exc:  # the handler's failure is data here, not ours
                self._running -= 1
                self._ended(stats, start, monotonic())
                await self._record_failure(d, exc)
                continue
            except asyncio.CancelledError as exc:
                self._running -= 1
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # we are being cancelled, not the handler's own doing
                self._ended(stats, start, monotonic())
                await self._record_failure(d, exc)
                continue
            except BaseException:  # SystemExit and the like: the process is going down
                self._running -= 1
                self._ended(stats, start, monotonic())
                self._release(d)  # no more heartbeats: the reaper retries it
                raise
            # _ended and _handler_done, inline: this is every run's path.
            end = monotonic()
            self._running -= 1
            stats.handled += 1
            stats.duration.observe(end - start)
            self._outstanding -= 1
            if self._reader_waiting is not None and self._room() >= self._read_min:
                self._wake_reader()
            if self._draining and not self._outstanding:
                self._handler_done_draining()
            acks.add(d)

    def _ended(self, stats: PairStats, start: float, end: float) -> None:
        stats.handled += 1
        stats.duration.observe(end - start)
        self._handler_done()

    def _thread_main(
        self, handler: Callable[[Delivery], Any], loop: asyncio.AbstractEventLoop
    ) -> None:
        """A handler slot for a plain function: a thread of its own, for the worker's life.

        Runs reach it through a queue and their ends go back in one deque, the event loop
        woken once per batch of ends, not once per run."""
        inbox, finished = self._inbox, self._finished
        monotonic = time.monotonic
        while True:
            d = inbox.get()
            if d is None:
                return
            start = monotonic()
            error: BaseException | None = None
            try:
                result = handler(d)
                if inspect.isawaitable(result):
                    asyncio.run_coroutine_threadsafe(_awaited(result), loop).result()
            except BaseException as exc:  # a failed attempt, whatever it raised
                error = exc
            finished.append((d, start, monotonic(), error))
            if not self._collect_pending:
                self._collect_pending = True
                loop.call_soon_threadsafe(self._collect)

    def _collect(self) -> None:
        """In the event loop: the runs the handler threads finished."""
        self._collect_pending = False  # before draining: a later end schedules again
        finished, pair_of, acks = self._finished, self._stream_pair, self._acks
        if not finished:
            return
        assert acks is not None
        while finished:
            d, start, end, error = finished.popleft()
            stats = pair_of[d.stream].stats
            stats.lag.observe(self._start_lag_s(d, start))
            self._ended(stats, start, end)
            if error is None:
                acks.add(d)
            else:
                task = asyncio.get_running_loop().create_task(self._record_failure(d, error))
                self._failing.add(task)
                task.add_done_callback(self._failing.discard)

    # -- outcomes ------------------------------------------------------------------------

    async def _record_failure(self, delivery: Delivery, exc: BaseException) -> str:
        """Report a failed attempt (its handler slot is already free); returns the outcome."""
        stats = self._stream_pair[delivery.stream].stats
        stats.failed += 1
        if isinstance(exc, Retry):
            error, permanent, delay_s = exc.reason, False, exc.delay_s
        elif isinstance(exc, PermanentError):
            error, permanent, delay_s = f"PermanentError: {exc}", True, None
        else:
            error, permanent, delay_s = f"{type(exc).__name__}: {exc}", False, None
        try:
            if self._fails is None:
                outcome = await self.fail(delivery, error, permanent=permanent, delay_s=delay_s)
            else:  # inside `run`: with the other failures of the moment, one call per shard
                delay_ms = None if delay_s is None else max(0, round(delay_s * 1000))
                failure = Failure(delivery, error, permanent, delay_ms)
                outcome = (await self._fails.fail(failure)).outcome
        except TimewheelError as err:
            log.warning("outcome_not_recorded", run_id=delivery.run_id, error=str(err))
            outcome = "unrecorded"
            stats.unrecorded += 1
        else:
            self.failed += 1
            if outcome == "retry":
                stats.retried += 1
            elif outcome == "dead":
                stats.dead += 1
            else:
                stats.stale += 1
        finally:
            self._release(delivery)
        self._failures.failed(delivery, exc, outcome)
        return outcome

    def _acks_done(
        self,
        batch: Sequence[Delivery],
        answers: list[bool] | None,
        error: TimewheelError | None,
    ) -> None:
        pair_of = self._stream_pair
        if answers is None:
            log.warning("outcome_not_recorded", runs=len(batch), error=str(error))
            for d in batch:
                pair_of[d.stream].stats.unrecorded += 1
        else:
            self.handled += len(batch)
            for d, acked in zip(batch, answers, strict=True):
                stats = pair_of[d.stream].stats
                if acked:
                    stats.acked += 1
                else:
                    stats.stale += 1
        leases, released = self._leases, 0
        for d in batch:  # _release, for a batch
            entries = leases.get(d.stream)
            if entries is not None and entries.pop(d.entry_id, None) is not None:
                released += 1
        self._owned -= released
        if self._reader_waiting is not None and self._room() >= self._read_min:
            self._wake_reader()

    async def _send_failures(self, batch: Sequence[Failure]) -> list[FailResult]:
        return await self.outcomes.fail_many(batch, self.group)

    async def _send_acks(self, batch: Sequence[Delivery]) -> list[bool]:
        if self._wire is not None:
            return await self._wire.ack_many(batch)
        return await self.outcomes.ack_many(batch, self.group)

    # -- leases and the clock ------------------------------------------------------------

    async def _keep_leases(self) -> None:
        """Extend the lease of every run held whose heartbeat is due; keep the clock fresh.

        XCLAIM <ids> JUSTID by the entry's own consumer resets its idle time, which is
        what the reaper measures; one call per stream covers all its runs held.
        """
        clock, client = self.store.clock, self.store.client
        next_clock = 0.0
        while True:
            await asyncio.sleep(LEASE_TICK_S)
            now = time.monotonic()
            if now >= next_clock:
                next_clock = now + CLOCK_CHECK_S
                with contextlib.suppress(RedisUnavailable):
                    await clock.now_ms_fresh(client)
                self._offset_ms = clock.now_ms() - time.monotonic() * 1000.0
            if now < self._next_beat:
                continue
            # Runs held while this pass awaits lower _next_beat themselves (_hold).
            self._next_beat = float("inf")
            for stream, entries in list(self._leases.items()):
                due: list[Any] = [eid for eid, (beat, _) in entries.items() if beat <= now]
                for eid in due:
                    interval = entries[eid][1]
                    entries[eid] = (now + interval, interval)
                if entries:
                    earliest = min(beat for beat, _ in entries.values())
                    self._next_beat = min(self._next_beat, earliest)
                if not due:
                    continue
                try:
                    await client.xclaim(stream, self.group, self.consumer, 0, due, justid=True)
                except UNREACHABLE as exc:
                    log.warning("heartbeat_failed", stream=stream, error=str(exc))

    # -- run -----------------------------------------------------------------------------

    def _gauges(self) -> dict[str, float]:
        acks = self._acks
        # Handler threads keep no count: a free thread takes the next run at once.
        running = min(self._outstanding, self.concurrency) if self._threads else self._running
        return {
            "timewheel_worker_running_handlers": running,
            "timewheel_worker_read_ahead_runs": max(0, self._outstanding - running),
            "timewheel_worker_unacked_runs": 0 if acks is None else acks.waiting + acks.sending,
            "timewheel_worker_concurrency": self.concurrency,
            "timewheel_worker_prefetch": self._prefetch_now,
            "timewheel_clock_offset_seconds": self.store.clock.skew_ms / 1000.0,
        }

    async def run(self, handler: Handler, stop: asyncio.Event) -> int:
        """Handle deliveries with bounded concurrency until `stop` is set; returns runs acked.

        On stop, reading ends; the handlers in flight and the runs already read finish
        (and ack or fail) first.
        """
        await self.ensure_groups()
        loop = asyncio.get_running_loop()
        with contextlib.suppress(RedisUnavailable):
            await self.store.clock.sync(self.store.client)
        self._offset_ms = self.store.clock.now_ms() - time.monotonic() * 1000.0
        self._draining = False
        self._drained = loop.create_future()
        self._failures = FailureLog(handler_name(handler), self._tracebacks_per_s)
        self._acks = AckBatcher(
            self._send_acks,
            self._acks_done,
            batch=self._ack_batch,
            delay_s=self._ack_delay_s,
            max_in_flight=self._ack_pipelines,
        )
        self._fails = FailureBatcher(self._send_failures, batch=self._ack_batch)
        keeper = asyncio.create_task(self._keep_leases())
        runners: list[asyncio.Task[None]] = []
        if is_async_handler(handler):
            runners = [
                asyncio.create_task(self._runner(handler))  # type: ignore[arg-type]
                for _ in range(self.concurrency)
            ]
        else:
            self._threads = [
                threading.Thread(
                    target=self._thread_main,
                    args=(handler, loop),
                    name=f"timewheel-handler-{i}",
                    daemon=True,
                )
                for i in range(self.concurrency)
            ]
            for thread in self._threads:
                thread.start()
        reader = asyncio.create_task(self._read_loop(stop))
        stopper = asyncio.create_task(self._stop_when(stop))
        started = time.monotonic()
        log.info(
            "worker_started",
            pairs=[f"{t}/{q}" for t, q in self.pairs],
            tenant=self.tenant,
            queue=self.queue,
            consumer=self.consumer,
            group=self.group,
            concurrency=self.concurrency,
            prefetch=self.prefetch,
            handler=self._failures.handler,
            runners="coroutines" if runners else "threads",
        )
        if self._wire is not None:
            self._wire.keep = True
        try:
            await reader
        finally:
            stopper.cancel()
            try:
                await self._drain(runners)
            finally:
                keeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await keeper
                self._acks = self._fails = None
                if self._wire is not None:
                    await self._wire.close()
                log.info(
                    "worker_stopped",
                    handled=self.handled,
                    failed=self.failed,
                    consumer=self.consumer,
                    seconds=round(time.monotonic() - started, 3),
                )
        return self.handled

    async def _stop_when(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self._wake_reader()

    async def _drain(self, runners: list[asyncio.Task[None]]) -> None:
        """Stop: the runs read and the handlers running finish, then their outcomes go."""
        self._draining = True
        assert self._drained is not None
        if not self._outstanding and not self._drained.done():
            self._drained.set_result(None)
        if runners:
            while self._idle:
                self._wake_runner()
            await asyncio.gather(*runners, return_exceptions=True)
        else:
            await self._drained
            for _ in self._threads:
                self._inbox.put(None)
            for thread in self._threads:
                await asyncio.to_thread(thread.join)
            self._collect()
            self._threads = []
        if self._failing:
            await asyncio.gather(*self._failing, return_exceptions=True)
        assert self._acks is not None
        await self._acks.close()


def run_worker(
    handler: Handler,
    *,
    tenant: str,
    queue: str,
    settings: Settings | None = None,
    group: str = DEFAULT_GROUP,
    concurrency: int = 10,
    prefetch: int | None = None,
) -> int:
    """The blocking facade: run a worker until SIGINT/SIGTERM; returns runs acked.

    `handler` may be a plain function (it runs in a thread of the worker's) or a
    coroutine function.
    """

    async def main() -> int:
        store = await Store.connect(settings or Settings.from_env())
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            worker = Worker(
                store, tenant, queue, group=group, concurrency=concurrency, prefetch=prefetch
            )
            return await worker.run(handler, stop)
        finally:
            await store.close()

    return asyncio.run(main())
