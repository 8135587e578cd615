"""The worker's runners: `concurrency` handler slots, each taking the next run read.

A coroutine each for an `async def` handler, taking runs from a deque (an idle runner is
woken only when another found more work than it can start); a thread each for a plain
function, so a blocking handler blocks nothing else, taking runs from a queue and handing
their ends back to the event loop in batches (one wake-up of the loop per batch, not per
run). So a run costs no task, no future and no thread hand-off of its own.

While the reader shares the slots between busy pairs (runs/reading.py; `Pair.cap`,
runs/serving.py), a run whose pair has its share of the slots in use (runs given to the
runners and not finished: `Pair.active`) is held back in the pair's `held` until one of
them finishes: the runners take runs in the order read, so a pair whose handlers are
slow would otherwise fill every slot in turn.
"""

from __future__ import annotations

import asyncio
import inspect
import queue as queues
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from timewheel.runs.acks import AckBatcher
from timewheel.runs.delivery import Delivery
from timewheel.runs.inflight import InFlight
from timewheel.runs.leases import LeaseKeeper
from timewheel.runs.serving import Pair

RecordFailure = Callable[[Delivery, BaseException], Coroutine[Any, Any, str]]


async def _awaited(value: Awaitable[Any]) -> Any:
    return await value


class Runners:
    """The handler slots of `Worker.run`, and the runs read waiting for one."""

    def __init__(
        self,
        concurrency: int,
        stream_pair: dict[str, Pair],
        inflight: InFlight,
        keeper: LeaseKeeper,
        record_failure: RecordFailure,
    ) -> None:
        self.concurrency = concurrency
        self._stream_pair = stream_pair
        self._inflight = inflight
        self._keeper = keeper
        self._record_failure = record_failure
        self._acks: AckBatcher | None = None
        self._buffer: deque[Delivery] = deque()
        self._inbox: queues.SimpleQueue[Delivery | None] = queues.SimpleQueue()
        self.threads: list[threading.Thread] = []
        self._finished: deque[tuple[Delivery, float, float, BaseException | None]] = deque()
        self._collect_pending = False
        self._idle: deque[asyncio.Future[None]] = deque()
        self._waking = 0
        self.running = 0
        """Coroutine handlers running now (handler threads keep no count)."""
        self.draining = False
        self._drained: asyncio.Future[None] | None = None
        self._failing: set[asyncio.Task[str]] = set()
        self._tasks: list[asyncio.Task[None]] = []

    def running_now(self) -> int:
        """Handlers running now: a free handler thread takes the next run at once."""
        if self.threads:
            return min(self._inflight.outstanding, self.concurrency)
        return self.running

    def start(
        self,
        handler: Callable[[Delivery], Any],
        acks: AckBatcher,
        coroutines: bool,
    ) -> None:
        """Start the slots: a coroutine each (`coroutines`), or a thread each."""
        loop = asyncio.get_running_loop()
        self.draining = False
        self._drained = loop.create_future()
        self._acks = acks
        if coroutines:
            self._tasks = [
                asyncio.create_task(self._runner(handler)) for _ in range(self.concurrency)
            ]
            return
        self.threads = [
            threading.Thread(
                target=self._thread_main,
                args=(handler, loop),
                name=f"timewheel-handler-{i}",
                daemon=True,
            )
            for i in range(self.concurrency)
        ]
        for thread in self.threads:
            thread.start()

    def take(self, deliveries: list[Delivery], shared: bool = False) -> None:
        """Runs read (their leases held): to the next free slots; with the slots `shared`
        between pairs, a run of a pair using its share is held back (let_go). Unshared,
        the reader counted them in their pairs' `active` already."""
        self._inflight.outstanding += len(deliveries)
        if shared:
            pair_of = self._stream_pair
            ready: list[Delivery] = []
            for d in deliveries:
                pair = pair_of[d.stream]
                if pair.cap and pair.active >= pair.cap:
                    pair.held.append(d)
                else:
                    pair.active += 1
                    ready.append(d)
            deliveries = ready
        self._give(deliveries)

    def let_go(self, pair: Pair) -> None:
        """Give the runners the runs the pair held back, as far as its share allows."""
        held, ready = pair.held, []
        while held and (not pair.cap or pair.active < pair.cap):
            ready.append(held.popleft())
            pair.active += 1
        if ready:
            self._give(ready)

    def _give(self, deliveries: list[Delivery]) -> None:
        if self.threads:
            put = self._inbox.put
            for d in deliveries:
                put(d)
        else:
            self._buffer.extend(deliveries)
            if self._idle and not self._waking:
                self._wake_runner()

    def _handler_done(self) -> None:
        """A handler returned or raised: its slot is free."""
        inflight = self._inflight
        inflight.outstanding -= 1
        if inflight.waiting is not None and inflight.room() >= inflight.read_min:
            inflight.wake_reader()
        if self.draining and not inflight.outstanding:
            self._handler_done_draining()

    def _handler_done_draining(self) -> None:
        """Stopping, the last run held finished: the drain may go on."""
        drained = self._drained
        if drained is not None and not drained.done():
            drained.set_result(None)

    def _wake_runner(self) -> None:
        while self._idle:
            waiter = self._idle.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._waking += 1
                return

    def _pair_done(self, pair: Pair) -> None:
        """One of the pair's runs finished: a run it held back may take the slot."""
        pair.active -= 1
        if pair.held:
            self.let_go(pair)

    def _ended(self, pair: Pair, start: float, end: float) -> None:
        self._pair_done(pair)
        stats = pair.stats
        stats.handled += 1
        stats.duration.observe(end - start)
        self._handler_done()

    async def _idle_wait(self) -> None:
        """A runner with nothing to run: wait until woken (take, _wake_runner)."""
        waiter = asyncio.get_running_loop().create_future()
        self._idle.append(waiter)
        try:
            await waiter
        finally:
            if waiter.done() and not waiter.cancelled():
                self._waking -= 1

    async def _runner(self, handler: Callable[[Delivery], Awaitable[None]]) -> None:
        """One handler slot: takes the next run read until the worker drains."""
        buffer, idle, pair_of, acks = self._buffer, self._idle, self._stream_pair, self._acks
        inflight, keeper = self._inflight, self._keeper
        assert acks is not None
        monotonic = time.monotonic
        while True:
            if not buffer:
                if self.draining:
                    return
                await self._idle_wait()
                continue
            d = buffer.popleft()
            if buffer and idle and not self._waking:
                self._wake_runner()
            pair = pair_of[d.stream]
            stats = pair.stats
            start = monotonic()
            redis_ms = start * 1000.0 + keeper.offset_ms  # keeper.start_lag_s, inline
            stats.lag.observe((max(redis_ms, d.dispatched_ms) - d.due_ms) / 1000.0)
            self.running += 1
            try:
                await handler(d)
            except Exception as exc:  # the handler's failure is data here, not ours
                self.running -= 1
                self._ended(pair, start, monotonic())
                await self._record_failure(d, exc)
                continue
            except asyncio.CancelledError as exc:
                self.running -= 1
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # we are being cancelled, not the handler's own doing
                self._ended(pair, start, monotonic())
                await self._record_failure(d, exc)
                continue
            except BaseException:  # SystemExit and the like: the process is going down
                self.running -= 1
                self._ended(pair, start, monotonic())
                keeper.release(d)  # no more heartbeats: the reaper retries it
                raise
            # _ended, _pair_done and _handler_done, inline: this is every run's path.
            end = monotonic()
            self.running -= 1
            pair.active -= 1
            if pair.held and pair.active < pair.cap:  # let_go of one run, inline
                pair.active += 1
                buffer.append(pair.held.popleft())  # this runner takes it next
            stats.handled += 1
            stats.duration.observe(end - start)
            inflight.outstanding -= 1
            if inflight.waiting is not None and inflight.room() >= inflight.read_min:
                inflight.wake_reader()
            if self.draining and not inflight.outstanding:
                self._handler_done_draining()
            acks.add(d)

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
        start_lag_s = self._keeper.start_lag_s
        while finished:
            d, start, end, error = finished.popleft()
            pair = pair_of[d.stream]
            pair.stats.lag.observe(start_lag_s(d, start))
            self._ended(pair, start, end)
            if error is None:
                acks.add(d)
            else:
                task = asyncio.get_running_loop().create_task(self._record_failure(d, error))
                self._failing.add(task)
                task.add_done_callback(self._failing.discard)

    async def drain(self) -> None:
        """Stop: the runs read and the handlers running finish, their failures recorded
        (their acks are left in the ack pipelines)."""
        self.draining = True
        for pair in set(self._stream_pair.values()):  # the runs held back go too
            pair.cap = 0
            if pair.held:
                self.let_go(pair)
        assert self._drained is not None
        if not self._inflight.outstanding and not self._drained.done():
            self._drained.set_result(None)
        if self._tasks:
            while self._idle:
                self._wake_runner()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            self._tasks = []
        else:
            await self._drained
            for _ in self.threads:
                self._inbox.put(None)
            for thread in self.threads:
                await asyncio.to_thread(thread.join)
            self._collect()
            self.threads = []
        if self._failing:
            await asyncio.gather(*self._failing, return_exceptions=True)
