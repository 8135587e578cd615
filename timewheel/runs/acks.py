"""Acknowledgements of finished runs, sent in pipelines of one run_ack call per shard.

A run is added once its handler has returned; nothing is acknowledged before that. Acks
wait by shard (`ByShard`): a shard's acks go as soon as `per_call` of them wait, and every
waiting ack goes `delay_s` after the oldest of them began to wait, or once `batch` of them
wait, whichever comes first. What a run_ack call writes once (the call itself, its
event-log entry, the expiry index, the usage counts) is so shared by more runs: a worker
draining 16 streams made calls of about 15 runs when it sent whatever had gathered, and
makes calls of about 44 this way (bench/worker.py, backlog). A pipeline carries the
shards whose turn it is, at most `batch` acks; at most `max_in_flight` pipelines are out
at a time, and when one comes back, what became due meanwhile follows at once. A pipeline
that fails is sent again after each of `retry_pauses_s` (an ack sent twice is harmless:
the second finds its entry gone and answers stale); if it still fails, its runs are
reported unrecorded, and the reaper retries them once their leases expire.

Failed attempts wait by shard the same way in `FailureBatcher`: one run_fail call per
shard, one pipeline out at a time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from timewheel.errors import TimewheelError
from timewheel.runs.delivery import Delivery
from timewheel.runs.outcomes import FailResult, Failure

ACK_BATCH = 1024
"""Acks per pipeline at most, and the waiting acks that make everything go at once. An ack
is some 55 bytes of a call and a call's own part some 250: 1,024 acks over 16 shards are
about 60 KB, four of Redis's 16 KB reads (each pass of its event loop with writes costs an
fsync under appendfsync always: some 250 acks share one)."""
ACK_PER_CALL = 64
"""A shard's waiting acks that go at once, as one run_ack call."""
ACK_DELAY_S = 0.025
"""How long an ack waits at most for others of its shard before it goes anyway."""
ACK_PIPELINES = 4
"""Ack pipelines out at a time at most (each on its own connection)."""
RETRY_PAUSES_S = (0.05, 0.25)

Sender = Callable[[Sequence[Delivery]], Awaitable[list[bool]]]
Done = Callable[[Sequence[Delivery], list[bool] | None, TimewheelError | None], None]
"""Told, per pipeline, each run's answer (True acked, False stale) or the error."""


def _one_shard(stream: str) -> int:
    return 0


T = TypeVar("T")


class ByShard(Generic[T]):
    """Reports waiting by shard, oldest first, and which of them the next pipeline takes."""

    __slots__ = ("_full", "_shard_of", "_shards", "_waiting", "batch", "count", "per_call")

    def __init__(self, shard_of: Callable[[str], int], per_call: int, batch: int) -> None:
        self._shard_of = shard_of
        self._shards: dict[str, int] = {}
        """Stream key -> shard, worked out once per stream."""
        self.batch = max(1, batch)
        self.per_call = max(1, min(per_call, self.batch))
        self._waiting: dict[int, list[T]] = {}
        """By shard, oldest first (and shards in the order they began to wait)."""
        self.count = 0
        self._full = 0
        """Shards holding per_call reports or more."""

    @property
    def full(self) -> bool:
        """Whether a shard holds a call's worth."""
        return self._full > 0

    def add(self, stream: str, item: T) -> bool:
        """Wait `item` (a report of a run delivered on `stream`); whether its shard now
        holds a call's worth or `batch` wait in all (a pipeline is due)."""
        shard = self._shards.get(stream)
        if shard is None:
            shard = self._shards[stream] = self._shard_of(stream)
        items = self._waiting.get(shard)
        if items is None:
            items = self._waiting[shard] = []
        items.append(item)
        self.count += 1
        if len(items) == self.per_call:
            self._full += 1
            return True
        return self.count >= self.batch

    def take(self, everything: bool) -> list[T]:
        """The next pipeline's reports, taken out: the full shards' (every shard's with
        `everything`), in the order the shards began to wait, at most `batch`."""
        per_call, room = self.per_call, self.batch
        batch: list[T] = []
        for shard in list(self._waiting):
            items = self._waiting[shard]
            if not everything and len(items) < per_call:
                continue
            taken = items if len(items) <= room else items[:room]
            batch.extend(taken)
            room -= len(taken)
            if len(items) >= per_call:
                self._full -= 1
            if taken is items:
                del self._waiting[shard]
            else:
                del items[: len(taken)]
                if len(items) >= per_call:
                    self._full += 1
            if not room:
                break
        self.count -= len(batch)
        return batch


class AckBatcher:
    """Acks runs in pipelines (see the module's doc); `add` never waits."""

    def __init__(
        self,
        send: Sender,
        done: Done,
        *,
        shard_of: Callable[[str], int] = _one_shard,
        batch: int = ACK_BATCH,
        per_call: int = ACK_PER_CALL,
        delay_s: float = ACK_DELAY_S,
        max_in_flight: int = ACK_PIPELINES,
        retry_pauses_s: Sequence[float] = RETRY_PAUSES_S,
    ) -> None:
        self._send = send
        self._done = done
        self._queue: ByShard[Delivery] = ByShard(shard_of, per_call, batch)
        self.batch = self._queue.batch
        self.delay_s = delay_s
        self.max_in_flight = max(1, max_in_flight)
        self.retry_pauses_s = tuple(retry_pauses_s)
        self._overdue = False
        """Everything waiting is due (the delay passed, or `batch` wait): it goes as soon as
        a pipeline may go out."""
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.sending = 0
        """Acks in pipelines that have not come back yet."""
        self.pipelines = 0
        """Pipelines sent (for the bench: acks per pipeline)."""

    @property
    def waiting(self) -> int:
        return self._queue.count

    def add(self, delivery: Delivery) -> None:
        if self._queue.add(delivery.stream, delivery):
            self.flush(everything=self._queue.count >= self.batch)
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.delay_s, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.flush(everything=True)

    def flush(self, *, everything: bool = True) -> None:
        """Send a pipeline of the shards whose turn it is (all of them with `everything`),
        if one may go out now; else they go when a pipeline comes back."""
        queue = self._queue
        if not queue.count:
            return
        if everything:
            self._overdue = True
        if len(self._tasks) >= self.max_in_flight or not (self._overdue or queue.full):
            return
        batch = queue.take(self._overdue)
        if not queue.count:  # (with room left, an overdue flush took everything)
            self._overdue = False
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        self.sending += len(batch)
        self.pipelines += 1
        task = asyncio.get_running_loop().create_task(self._pipeline(batch))
        self._tasks.add(task)

    async def _pipeline(self, batch: list[Delivery]) -> None:
        try:
            error: TimewheelError | None = None
            for pause in (*self.retry_pauses_s, None):
                try:
                    answers = await self._send(batch)
                except TimewheelError as exc:
                    error = exc
                    if pause is None:
                        break
                    await asyncio.sleep(pause)
                else:
                    self._done(batch, answers, None)
                    return
            self._done(batch, None, error)
        finally:
            self.sending -= len(batch)
            task = asyncio.current_task()
            if task is not None:
                self._tasks.discard(task)
            if self._queue.count:
                self.flush(everything=False)

    async def close(self) -> None:
        """Send everything that waits and wait for every pipeline to come back."""
        while self._queue.count or self._tasks:
            self.flush(everything=True)
            if self._tasks:
                await asyncio.wait(set(self._tasks))


FailSender = Callable[[Sequence[Failure]], Awaitable[list[FailResult]]]


class FailureBatcher:
    """Reports failed attempts together, waiting by shard as acks do (`ByShard`): a
    shard's failures go once `per_call` of them wait, and all of them `delay_s` after the
    oldest began to wait or once `batch` wait; one `Outcomes.fail_many` pipeline (one
    run_fail call per shard) is out at a time, and what became due while it was out goes
    when it comes back. Each caller awaits its own run's answer; a pipeline that fails
    raises its error in each.
    """

    def __init__(
        self,
        send: FailSender,
        *,
        shard_of: Callable[[str], int] = _one_shard,
        batch: int = ACK_BATCH,
        per_call: int = ACK_PER_CALL,
        delay_s: float = ACK_DELAY_S,
    ) -> None:
        self._send = send
        self._queue: ByShard[tuple[Failure, asyncio.Future[FailResult]]] = ByShard(
            shard_of, per_call, batch
        )
        self.batch = self._queue.batch
        self.delay_s = delay_s
        self._overdue = False
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None

    async def fail(self, failure: Failure) -> FailResult:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[FailResult] = loop.create_future()
        if self._queue.add(failure.delivery.stream, (failure, answer)):
            self._overdue = self._overdue or self._queue.count >= self.batch
            self._start()
        elif self._timer is None:
            self._timer = loop.call_later(self.delay_s, self._on_timer)
        return await answer

    def _on_timer(self) -> None:
        self._timer = None
        self._overdue = True
        self._start()

    def _start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._pipelines())

    async def _pipelines(self) -> None:
        queue = self._queue
        try:
            while queue.count and (self._overdue or queue.full):
                batch = queue.take(self._overdue)
                if not queue.count:
                    self._overdue = False
                    if self._timer is not None:
                        self._timer.cancel()
                        self._timer = None
                try:
                    results = await self._send([f for f, _ in batch])
                except TimewheelError as exc:
                    for _, answer in batch:
                        if not answer.done():
                            answer.set_exception(exc)
                else:
                    for (_, answer), result in zip(batch, results, strict=True):
                        if not answer.done():
                            answer.set_result(result)
        finally:
            self._task = None
            if queue.count and self._timer is None and not self._overdue:
                self._timer = asyncio.get_running_loop().call_later(self.delay_s, self._on_timer)
