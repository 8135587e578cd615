"""Acknowledgements of finished runs, sent in pipelines of one run_ack call per shard.

A run is added once its handler has returned; nothing is acknowledged before that. The
waiting acks go out as one pipeline when `batch` of them wait, or `delay_s` after the
first of them began to wait, whichever comes first; and whenever a pipeline comes back,
the acks that gathered while it was out follow at once. At most `max_in_flight`
pipelines are out at a time, each at most `batch` acks, so a burst of acks cannot hold
Redis for long. A pipeline that fails is sent again after each of `retry_pauses_s` (an
ack sent twice is harmless: the second finds its entry gone and answers stale); if it
still fails, its runs are reported unrecorded, and the reaper retries them once their
leases expire.

Failed attempts go the same way in `FailureBatcher`: one run_fail call per shard for the
failures that gathered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from timewheel.errors import TimewheelError
from timewheel.runs.delivery import Delivery
from timewheel.runs.outcomes import FailResult, Failure

ACK_BATCH = 200
"""Acks per pipeline at most; a full batch is sent at once. A pipeline is one run_ack call
per shard (lua/run_ack.lua takes many runs), so what a call writes once (the event-log
entry, the expiry index, the usage counts, the call itself) is shared by the acks of its
shard: the more acks, the less Redis time each. An ack is some 55 bytes of a call and a
call's own part some 250: 200 acks spread over 16 shards are about 15 KB. Redis reads a
client's commands 16 KB at a time and fsyncs (appendfsync always) once per pass of its
event loop, so a bigger pipeline would span passes, while pipelines on several
connections share one pass."""
ACK_DELAY_S = 0.002
"""How long the first waiting ack waits for others before its pipeline goes."""
ACK_PIPELINES = 4
"""Ack pipelines out at a time at most (each on its own connection)."""
RETRY_PAUSES_S = (0.05, 0.25)

Sender = Callable[[Sequence[Delivery]], Awaitable[list[bool]]]
Done = Callable[[Sequence[Delivery], list[bool] | None, TimewheelError | None], None]
"""Told, per pipeline, each run's answer (True acked, False stale) or the error."""


class AckBatcher:
    """Acks runs in pipelines (see the module's doc); `add` never waits."""

    def __init__(
        self,
        send: Sender,
        done: Done,
        *,
        batch: int = ACK_BATCH,
        delay_s: float = ACK_DELAY_S,
        max_in_flight: int = ACK_PIPELINES,
        retry_pauses_s: Sequence[float] = RETRY_PAUSES_S,
    ) -> None:
        self._send = send
        self._done = done
        self.batch = max(1, batch)
        self.delay_s = delay_s
        self.max_in_flight = max(1, max_in_flight)
        self.retry_pauses_s = tuple(retry_pauses_s)
        self._waiting: list[Delivery] = []
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.sending = 0
        """Acks in pipelines that have not come back yet."""
        self.pipelines = 0
        """Pipelines sent (for the bench: acks per pipeline)."""

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def add(self, delivery: Delivery) -> None:
        waiting = self._waiting
        waiting.append(delivery)
        if len(waiting) >= self.batch:
            self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.delay_s, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.flush()

    def flush(self) -> None:
        """Send what waits, if a pipeline may go out now (else it follows the next reply)."""
        if not self._waiting or len(self._tasks) >= self.max_in_flight:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch = self._waiting[: self.batch]
        del self._waiting[: self.batch]
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
            if self._waiting:
                self.flush()

    async def close(self) -> None:
        """Send everything that waits and wait for every pipeline to come back."""
        while self._waiting or self._tasks:
            self.flush()
            if self._tasks:
                await asyncio.wait(set(self._tasks))


FailSender = Callable[[Sequence[Failure]], Awaitable[list[FailResult]]]


class FailureBatcher:
    """Reports failed attempts together: the failures reported in one pass of the event
    loop, or while a call is out, go as one `Outcomes.fail_many` pipeline (one run_fail
    call per shard), at most `batch` at a time and one pipeline out at a time. Each
    caller awaits its own run's answer; a pipeline that fails raises its error in each.
    """

    def __init__(self, send: FailSender, *, batch: int = ACK_BATCH) -> None:
        self._send = send
        self.batch = max(1, batch)
        self._waiting: list[tuple[Failure, asyncio.Future[FailResult]]] = []
        self._task: asyncio.Task[None] | None = None

    async def fail(self, failure: Failure) -> FailResult:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[FailResult] = loop.create_future()
        self._waiting.append((failure, answer))
        if self._task is None:
            self._task = loop.create_task(self._pipelines())
        return await answer

    async def _pipelines(self) -> None:
        try:
            await asyncio.sleep(0)  # the failures of this pass of the loop join
            while self._waiting:
                batch = self._waiting[: self.batch]
                del self._waiting[: self.batch]
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
