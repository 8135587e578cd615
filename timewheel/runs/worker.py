"""Executor library: read a (tenant, queue) across the tenant's shards, run a handler, ack.

A handler gets a Delivery (run_id is the idempotency key: stable across retries and
redeliveries). Returning acks the run (state succeeded). Raising fails the attempt: the
`fail` script retries it after backoff or dead-letters it past max_attempts;
PermanentError dead-letters at once; `Retry(delay_s)` asks for a retry after that delay.
While a handler runs, the worker extends the run's lease (visibility timeout) by
heartbeat, so a long handler is not retried meanwhile; if the worker dies, the scheduler's
reaper retries the run once the lease expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from redis.exceptions import RedisError

from timewheel.config import Settings
from timewheel.errors import PermanentError, RedisUnavailable, TimewheelError
from timewheel.ids import validate_name
from timewheel.runs.delivery import Delivery, parse_entry
from timewheel.runs.outcomes import Outcomes
from timewheel.runs.signals import Retry
from timewheel.store.shard import Store

log = structlog.get_logger("timewheel.worker")

DEFAULT_GROUP = "timewheel"

Handler = Callable[[Delivery], Awaitable[None]] | Callable[[Delivery], None]


class Worker:
    """Reads one tenant's queue from every shard stream of that tenant, as one consumer."""

    def __init__(
        self,
        store: Store,
        tenant: str,
        queue: str,
        *,
        group: str = DEFAULT_GROUP,
        consumer: str | None = None,
        concurrency: int = 10,
    ) -> None:
        self.store = store
        self.outcomes = Outcomes(store)
        self.tenant = validate_name(tenant, "tenant")
        self.queue = validate_name(queue, "queue")
        self.group = validate_name(group, "group")
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}"
        self.concurrency = max(1, concurrency)
        self.streams = [store.keys.stream(s, tenant, queue) for s in store.shards_of(tenant)]
        self.handled = 0
        self.failed = 0
        self._groups_ready = False
        self._in_flight: dict[Delivery, float] = {}  # delivery -> next heartbeat (monotonic)
        self._acks: asyncio.Queue[tuple[Delivery, asyncio.Future[bool]]] = asyncio.Queue()
        self._acker: asyncio.Task[None] | None = None

    async def ensure_groups(self) -> None:
        """Create the consumer group on each stream (from its start, so nothing is missed)."""
        for stream in self.streams:
            await self.outcomes.register_group(stream, self.group)
        self._groups_ready = True

    async def read(self, count: int = 100, block_ms: int = 1000) -> list[Delivery]:
        """New deliveries for this consumer, waiting up to block_ms when there are none."""
        if not self._groups_ready:
            await self.ensure_groups()
        try:
            if self.store.is_cluster and len(self.streams) > 1:
                # Cluster: one call per shard (each stream may live on another node).
                replies = await asyncio.gather(
                    *(self._read_one({s: ">"}, count, block_ms) for s in self.streams)
                )
                raw = [item for reply in replies for item in reply]
            else:
                raw = await self._read_one({s: ">" for s in self.streams}, count, block_ms)
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"read failed: {exc}") from exc
        out: list[Delivery] = []
        for stream_name, entries in raw:
            stream = stream_name.decode() if isinstance(stream_name, bytes) else stream_name
            out.extend(parse_entry(stream, eid, fields) for eid, fields in entries)
        return out

    async def _read_one(self, streams: dict[str, str], count: int, block_ms: int) -> list[Any]:
        wanted: dict[Any, Any] = dict(streams)
        reply = await self.store.client.xreadgroup(
            self.group, self.consumer, wanted, count=count, block=block_ms
        )
        if isinstance(reply, dict):  # RESP3 shape
            return list(reply.items())
        return list(reply or [])

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
        timeout = delivery.visibility_timeout_ms or self.store.settings.visibility_timeout_ms
        return max(0.05, timeout / 3000.0)

    async def _keep_leases(self) -> None:
        """One loop extends the lease of every run in flight whose heartbeat is due.

        XCLAIM <ids> JUSTID by the entry's own consumer resets its idle time, which is
        what the reaper measures; one call per stream covers all its runs in flight.
        """
        while True:
            await asyncio.sleep(0.05)
            now = time.monotonic()
            due: dict[str, list[Delivery]] = {}
            for delivery, next_beat in list(self._in_flight.items()):
                if next_beat <= now:
                    due.setdefault(delivery.stream, []).append(delivery)
                    self._in_flight[delivery] = now + self.heartbeat_interval_s(delivery)
            for stream, deliveries in due.items():
                try:
                    await self.store.client.xclaim(
                        stream,
                        self.group,
                        self.consumer,
                        0,
                        [d.entry_id for d in deliveries],
                        justid=True,
                    )
                except (RedisError, OSError) as exc:
                    log.warning("heartbeat_failed", stream=stream, error=str(exc))

    async def _ack_batches(self) -> None:
        """Acknowledge finished runs in pipelined batches (one round trip for many)."""
        while True:
            first = await self._acks.get()
            batch = [first]
            while not self._acks.empty() and len(batch) < 1000:
                batch.append(self._acks.get_nowait())
            try:
                answers = await self.outcomes.ack_many([d for d, _ in batch], self.group)
            except TimewheelError as exc:
                for _, done in batch:
                    done.set_exception(exc)
                continue
            for (_, done), answer in zip(batch, answers, strict=True):
                done.set_result(answer)

    async def _ack(self, delivery: Delivery) -> bool:
        if self._acker is None:  # outside run(): one call
            return await self.ack(delivery)
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._acks.put_nowait((delivery, done))
        return await done

    async def handle(self, handler: Handler, delivery: Delivery) -> str:
        """Run the handler on one delivery, its lease kept by heartbeat; ack or fail.

        Returns acked, retry, dead, stale, or unrecorded (Redis did not take the outcome:
        the entry stays pending and the reaper retries the run once its lease expires).
        """
        self._in_flight[delivery] = time.monotonic() + self.heartbeat_interval_s(delivery)
        try:
            outcome = await self._outcome(handler, delivery)
        except TimewheelError as exc:
            log.warning("outcome_not_recorded", run_id=delivery.run_id, error=str(exc))
            return "unrecorded"
        finally:
            self._in_flight.pop(delivery, None)
        if outcome == "acked":
            self.handled += 1
        else:
            self.failed += 1
        return outcome

    async def _outcome(self, handler: Handler, delivery: Delivery) -> str:
        try:
            if inspect.iscoroutinefunction(handler):
                await handler(delivery)
            else:
                result = await asyncio.to_thread(handler, delivery)
                if inspect.isawaitable(result):
                    await result
        except Retry as signal_:
            return await self.fail(delivery, signal_.reason, delay_s=signal_.delay_s)
        except PermanentError as exc:
            return await self.fail(delivery, f"PermanentError: {exc}", permanent=True)
        except Exception as exc:  # the handler's failure is data here, not ours
            return await self.fail(delivery, f"{type(exc).__name__}: {exc}")
        await self._ack(delivery)
        return "acked"

    async def run(self, handler: Handler, stop: asyncio.Event) -> int:
        """Handle deliveries with bounded concurrency until `stop` is set; returns runs acked.

        On stop, reading ends and the handlers in flight finish (and ack or fail) first.
        """
        await self.ensure_groups()
        in_flight: set[asyncio.Task[str]] = set()
        helpers = [asyncio.create_task(self._keep_leases())]
        self._acker = asyncio.create_task(self._ack_batches())
        helpers.append(self._acker)
        log.info("worker_started", tenant=self.tenant, queue=self.queue, consumer=self.consumer)
        try:
            while not stop.is_set():
                free = self.concurrency - len(in_flight)
                if free <= 0:
                    await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                    continue
                # COUNT applies per stream: share the free slots between the streams (a
                # read may still overshoot a little; those runs are ours, so they run).
                per_stream = -(-free // len(self.streams))
                try:
                    deliveries = await self.read(count=per_stream, block_ms=200)
                except RedisUnavailable as exc:
                    log.warning("read_failed", error=str(exc))
                    await asyncio.sleep(0.5)
                    continue
                for delivery in deliveries:
                    task = asyncio.create_task(self.handle(handler, delivery))
                    in_flight.add(task)
                    task.add_done_callback(in_flight.discard)
        finally:
            if in_flight:
                await asyncio.gather(*in_flight, return_exceptions=True)
            for helper in helpers:
                helper.cancel()
            for helper in helpers:
                with contextlib.suppress(asyncio.CancelledError):
                    await helper
            self._acker = None
            log.info("worker_stopped", handled=self.handled, failed=self.failed)
        return self.handled


def run_worker(
    handler: Handler,
    *,
    tenant: str,
    queue: str,
    settings: Settings | None = None,
    group: str = DEFAULT_GROUP,
    concurrency: int = 10,
) -> int:
    """The blocking facade: run a worker until SIGINT/SIGTERM; returns runs acked.

    `handler` may be a plain function (it runs in a thread) or a coroutine function.
    """

    async def main() -> int:
        store = await Store.connect(settings or Settings.from_env())
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            worker = Worker(store, tenant, queue, group=group, concurrency=concurrency)
            return await worker.run(handler, stop)
        finally:
            await store.close()

    return asyncio.run(main())
