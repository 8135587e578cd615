"""Executor library: read (tenant, queue) pairs across their shards, run a handler, ack.

A handler gets a Delivery (run_id is the idempotency key: stable across retries and
redeliveries). Returning acks the run (state succeeded). Raising fails the attempt: the
`fail` script retries it after backoff or dead-letters it past max_attempts;
PermanentError dead-letters at once; `Retry(delay_s)` asks for a retry after that delay.
While a handler runs, the worker extends the run's lease (visibility timeout) by
heartbeat, so a long handler is not retried meanwhile; if the worker dies, the scheduler's
reaper retries the run once the lease expires.

`run` keeps reading, handling and acknowledging going at once, each part an object of
its own module, the counts they share in one `InFlight` (runs/inflight.py):

- **the reader** (runs/reading.py) reads ahead: while handlers run it reads the next
  runs, as many as free handler slots plus `prefetch`, so the next batch is there when a
  slot frees; several (tenant, queue) pairs share it fairly, round robin (the pairs and
  their streams, found again as tenants' shards grow and patterns match new tenants:
  runs/serving.py);
- **the runners** (runs/runners.py): `concurrency` of them, each taking the next run
  read (a coroutine each for an `async def` handler; a thread each for a plain function,
  so a blocking handler blocks nothing else), so a run costs no task and no thread
  hand-off of its own; while several pairs have work, each pair runs at most its share
  of them, so one with slow handlers cannot hold every slot;
- **the recorder** (runs/recording.py) sends the acks in pipelines (runs/acks.py) once
  the handler has returned: never before. Outcomes not yet recorded are bounded too: the
  reader waits when they pile up;
- **the lease keeper** (runs/leases.py) extends the lease of every run read and not yet
  recorded, by heartbeat, and keeps the process's estimate of Redis's clock fresh (for
  the start lag).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Iterable

import redis.asyncio as aioredis
import structlog

from timewheel.config import Settings
from timewheel.errors import ConfigError, RedisUnavailable, TimewheelError
from timewheel.ids import validate_name
from timewheel.runs.acks import ACK_BATCH, ACK_DELAY_S, ACK_PER_CALL, ACK_PIPELINES
from timewheel.runs.delivery import Delivery
from timewheel.runs.failures import TRACEBACKS_PER_S, FailureLog, handler_name
from timewheel.runs.inflight import InFlight
from timewheel.runs.leases import LeaseKeeper
from timewheel.runs.metrics import WorkerMetrics
from timewheel.runs.outcomes import Outcomes
from timewheel.runs.patterns import TENANTS_REFRESH_S, is_pattern, tenant_or_pattern
from timewheel.runs.reading import Reader
from timewheel.runs.recording import Recorder
from timewheel.runs.runners import Runners
from timewheel.runs.serving import Pair, Served
from timewheel.runs.wire import Wire
from timewheel.store.shard import Store

log = structlog.get_logger("timewheel.worker")

DEFAULT_GROUP = "timewheel"

Handler = Callable[[Delivery], Awaitable[None]] | Callable[[Delivery], None]


def is_async_handler(handler: Callable[..., object]) -> bool:
    """An `async def` (also behind functools.partial, or as a callable's __call__)."""
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 - a callable object's method
    )


class Worker:
    """Reads (tenant, queue) pairs from every shard stream of their tenants, as one consumer.

    `Worker(store, tenant, queue)` serves one pair; `pairs=[(tenant, queue), ...]` adds
    more (or gives them all, without `tenant`). A tenant may be a pattern (`acme-*`,
    `*`: runs/patterns.py): the worker serves the queue of every registered tenant it
    matches, and of each tenant registered later, within `tenants_refresh_s`.
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
        ack_per_call: int = ACK_PER_CALL,
        ack_delay_s: float = ACK_DELAY_S,
        ack_pipelines: int = ACK_PIPELINES,
        tracebacks_per_s: float = TRACEBACKS_PER_S,
        tenants_refresh_s: float = TENANTS_REFRESH_S,
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
        self.metrics = metrics or WorkerMetrics()
        self.metrics.gauges = self._gauges
        self.metrics.pair_gauges = self._pair_gauges
        named: list[Pair] = []
        patterns: list[tuple[str, str]] = []
        for t, q in dict.fromkeys(wanted):  # in order, without repeats
            t, q = tenant_or_pattern(t), validate_name(q, "queue")
            if is_pattern(t):
                patterns.append((t, q))
            else:
                named.append(self._pair(t, q))
        self.tenant, self.queue = (named[0].tenant, named[0].queue) if named else patterns[0]
        """The first pair given (a pattern's, when no tenant is named)."""
        self.patterns = patterns
        self._served = served = Served(
            store,
            self.outcomes,
            self.group,
            named,
            patterns=patterns,
            new_pair=self._pair,
            tenants_refresh_s=tenants_refresh_s,
        )
        client = store.client
        self._wire = (
            Wire(client, self.outcomes, self.group, self.consumer)
            if isinstance(client, aioredis.Redis)
            else None
        )
        """The bulk calls of runs/wire.py (standalone Redis only)."""
        self._inflight = inflight = InFlight()
        self._keeper = keeper = LeaseKeeper(store, self.group, self.consumer, inflight)
        stream_pair = served.stream_pair
        self._recorder = Recorder(
            self.outcomes,
            self.group,
            self._wire,
            stream_pair,
            keeper,
            inflight,
            ack_batch=ack_batch,
            ack_per_call=ack_per_call,
            ack_delay_s=ack_delay_s,
            ack_pipelines=ack_pipelines,
            tracebacks_per_s=tracebacks_per_s,
        )
        self._runners = Runners(
            self.concurrency, stream_pair, inflight, keeper, self._recorder.record_failure
        )
        self._reader = Reader(
            store,
            self.group,
            self.consumer,
            self._wire,
            served,
            concurrency=self.concurrency,
            prefetch=self.prefetch,
            inflight=inflight,
            keeper=keeper,
            runners=self._runners,
        )

    def _pair(self, tenant: str, queue: str) -> Pair:
        streams = [self.store.keys.stream(s, tenant, queue) for s in self.store.shards_of(tenant)]
        return Pair(tenant, queue, streams, self.metrics.pair(tenant, queue))

    @property
    def pairs(self) -> list[tuple[str, str]]:
        """The (tenant, queue) pairs served: those named, then those the patterns found."""
        return [(p.tenant, p.queue) for p in self._served.pairs]

    @property
    def streams(self) -> list[str]:
        """Every stream read: each pair's, on every shard its tenant has used."""
        return self._served.streams

    @property
    def handled(self) -> int:
        """Runs whose ack Redis recorded."""
        return self._recorder.handled

    @property
    def failed(self) -> int:
        """Failed attempts Redis recorded (retried, dead-lettered or stale)."""
        return self._recorder.failed

    # -- the steps, for an executor with its own loop ------------------------------------

    async def ensure_groups(self) -> None:
        """Create the consumer group on each stream (from its start, so nothing is missed)."""
        await self._served.ensure_groups()

    async def read(self, count: int = 100, block_ms: int = 1000) -> list[Delivery]:
        """New deliveries for this consumer (up to `count` per stream), waiting up to
        block_ms when there are none."""
        served = self._served
        if not served.groups_ready:
            await served.ensure_groups()
        await served.refresh_if_due()
        if not served.streams:  # patterns that match no tenant yet
            await asyncio.sleep(block_ms / 1000)
            return []
        replies = await self._reader.read_streams([(count, served.streams)], block_ms)
        return [d for _, _, got in replies for d in got]

    async def ack(self, delivery: Delivery) -> bool:
        """Mark a delivery done (state succeeded). False if the run had moved on."""
        return await self._recorder.ack(delivery)

    async def fail(
        self,
        delivery: Delivery,
        error: str,
        *,
        permanent: bool = False,
        delay_s: float | None = None,
    ) -> str:
        """Fail this attempt; returns 'retry', 'dead' or 'stale'."""
        return await self._recorder.fail(delivery, error, permanent=permanent, delay_s=delay_s)

    def heartbeat_interval_s(self, delivery: Delivery) -> float:
        """A third of the run's visibility timeout: two heartbeats may be lost safely."""
        return self._keeper.beat_s(delivery.visibility_timeout_ms)

    async def handle(self, handler: Handler, delivery: Delivery) -> str:
        """Run the handler on one delivery, its lease kept by heartbeat while `run`'s
        lease keeper runs; then ack or fail it, one call each.

        Returns acked, retry, dead, stale, or unrecorded (Redis did not take the outcome:
        the entry stays pending and the reaper retries the run once its lease expires).
        """
        recorder, keeper = self._recorder, self._keeper
        keeper.hold([delivery], time.monotonic())
        stats = self._served.stream_pair[delivery.stream].stats
        if recorder.acks is None:  # not inside `run`: failures are logged under this handler
            recorder.failures = FailureLog(handler_name(handler), recorder.tracebacks_per_s)
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
                return await recorder.record_failure(delivery, exc)
            stats.handled += 1
            try:
                await self.ack(delivery)
            except TimewheelError as exc:
                log.warning("outcome_not_recorded", run_id=delivery.run_id, error=str(exc))
                stats.unrecorded += 1
                return "unrecorded"
            stats.acked += 1
            recorder.handled += 1
            return "acked"
        finally:
            keeper.release(delivery)

    # -- run -----------------------------------------------------------------------------

    def _gauges(self) -> dict[str, float]:
        acks = self._recorder.acks
        running = self._runners.running_now()
        return {
            "timewheel_worker_running_handlers": running,
            "timewheel_worker_read_ahead_runs": max(0, self._inflight.outstanding - running),
            "timewheel_worker_unacked_runs": 0 if acks is None else acks.waiting + acks.sending,
            "timewheel_worker_concurrency": self.concurrency,
            "timewheel_worker_prefetch": self._reader.prefetch_now,
            "timewheel_clock_offset_seconds": self.store.clock.skew_ms / 1000.0,
        }

    def _pair_gauges(self) -> list[tuple[str, str, int, int, int]]:
        return [(p.tenant, p.queue, p.active, len(p.held), p.cap) for p in self._served.pairs]

    async def run(self, handler: Handler, stop: asyncio.Event) -> int:
        """Handle deliveries with bounded concurrency until `stop` is set; returns runs acked.

        On stop, reading ends; the handlers in flight and the runs already read finish
        (and ack or fail) first.
        """
        await self.ensure_groups()
        with contextlib.suppress(RedisUnavailable):
            await self.store.clock.sync(self.store.client)
        self._keeper.read_clock()
        acks = self._recorder.open(handler_name(handler))
        keeper = asyncio.create_task(self._keeper.keep())
        coroutines = is_async_handler(handler)
        self._runners.start(handler, acks, coroutines)
        reader = asyncio.create_task(self._reader.loop(stop))
        stopper = asyncio.create_task(self._stop_when(stop))
        started = time.monotonic()
        log.info(
            "worker_started",
            pairs=[f"{t}/{q}" for t, q in self.pairs],
            patterns=[f"{t}/{q}" for t, q in self.patterns],
            tenant=self.tenant,
            queue=self.queue,
            consumer=self.consumer,
            group=self.group,
            concurrency=self.concurrency,
            prefetch=self.prefetch,
            handler=self._recorder.failures.handler,
            runners="coroutines" if coroutines else "threads",
        )
        if self._wire is not None:
            self._wire.keep = True
        try:
            await reader
        finally:
            stopper.cancel()
            try:
                await self._drain()
            finally:
                keeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await keeper
                self._recorder.end()
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
        self._inflight.wake_reader()

    async def _drain(self) -> None:
        """Stop: the runs read and the handlers running finish, then their outcomes go."""
        await self._runners.drain()
        acks = self._recorder.acks
        assert acks is not None
        await acks.close()


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
