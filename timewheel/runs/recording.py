"""The worker's outcome recorder: handlers' returns and raises, recorded in Redis.

Inside `Worker.run` acks go out in pipelines and failures in batches (runs/acks.py);
outside it (the steps `handle`, `ack`, `fail`) one call each. A run is released (its
lease no longer kept) once Redis took its outcome, or once it did not: then the entry
stays pending and the reaper retries the run when its lease expires.
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from timewheel.errors import PermanentError, TimewheelError
from timewheel.runs.acks import AckBatcher, FailureBatcher
from timewheel.runs.delivery import Delivery
from timewheel.runs.failures import FailureLog
from timewheel.runs.inflight import InFlight
from timewheel.runs.leases import LeaseKeeper
from timewheel.runs.outcomes import FailResult, Failure, Outcomes
from timewheel.runs.serving import Pair
from timewheel.runs.signals import Retry
from timewheel.runs.wire import Wire

log = structlog.get_logger("timewheel.worker")


class Recorder:
    """Records outcomes, counts them per pair, and releases the runs recorded."""

    def __init__(
        self,
        outcomes: Outcomes,
        group: str,
        wire: Wire | None,
        stream_pair: dict[str, Pair],
        keeper: LeaseKeeper,
        inflight: InFlight,
        *,
        ack_batch: int,
        ack_per_call: int,
        ack_delay_s: float,
        ack_pipelines: int,
        tracebacks_per_s: float,
    ) -> None:
        self.outcomes = outcomes
        self.group = group
        self._wire = wire
        self._stream_pair = stream_pair
        self._keeper = keeper
        self._inflight = inflight
        self._ack_batch = ack_batch
        self._ack_per_call = ack_per_call
        self._ack_delay_s = ack_delay_s
        self._ack_pipelines = ack_pipelines
        self.tracebacks_per_s = tracebacks_per_s
        self.handled = 0
        """Runs whose ack Redis recorded."""
        self.failed = 0
        """Failed attempts Redis recorded (retried, dead-lettered or stale)."""
        self.acks: AckBatcher | None = None
        """The ack pipelines, while `Worker.run` runs."""
        self.fails: FailureBatcher | None = None
        self.failures = FailureLog("", tracebacks_per_s)

    def open(self, handler: str) -> AckBatcher:
        """`Worker.run` starts: failures are logged under `handler`, outcomes batched."""
        self.failures = FailureLog(handler, self.tracebacks_per_s)
        self.acks = AckBatcher(
            self.send_acks,
            self.acks_done,
            shard_of=self.outcomes.store.keys.shard_of_key,
            batch=self._ack_batch,
            per_call=self._ack_per_call,
            delay_s=self._ack_delay_s,
            max_in_flight=self._ack_pipelines,
        )
        self.fails = FailureBatcher(
            self.send_failures,
            shard_of=self.outcomes.store.keys.shard_of_key,
            batch=self._ack_batch,
            per_call=self._ack_per_call,
            delay_s=self._ack_delay_s,
        )
        return self.acks

    def end(self) -> None:
        """`Worker.run` returns: outcomes are recorded one call each again."""
        self.acks = self.fails = None

    async def ack(self, delivery: Delivery) -> bool:
        return await self.outcomes.ack(delivery, self.group)

    async def fail(
        self,
        delivery: Delivery,
        error: str,
        *,
        permanent: bool = False,
        delay_s: float | None = None,
    ) -> str:
        delay_ms = None if delay_s is None else max(0, round(delay_s * 1000))
        res = await self.outcomes.fail(
            delivery, self.group, error, permanent=permanent, delay_ms=delay_ms
        )
        return res.outcome

    async def record_failure(self, delivery: Delivery, exc: BaseException) -> str:
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
            if self.fails is None:
                outcome = await self.fail(delivery, error, permanent=permanent, delay_s=delay_s)
            else:  # inside `run`: with the other failures of the moment, one call per shard
                delay_ms = None if delay_s is None else max(0, round(delay_s * 1000))
                failure = Failure(delivery, error, permanent, delay_ms)
                outcome = (await self.fails.fail(failure)).outcome
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
            self._keeper.release(delivery)
        self.failures.failed(delivery, exc, outcome)
        return outcome

    def acks_done(
        self,
        batch: Sequence[Delivery],
        answers: list[bool] | None,
        error: TimewheelError | None,
    ) -> None:
        """A pipeline of acks came back (answers), or was given up on (error)."""
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
        self._keeper.release_many(batch)
        inflight = self._inflight
        if inflight.waiting is not None and inflight.room() >= inflight.read_min:
            inflight.wake_reader()

    async def send_failures(self, batch: Sequence[Failure]) -> list[FailResult]:
        return await self.outcomes.fail_many(batch, self.group)

    async def send_acks(self, batch: Sequence[Delivery]) -> list[bool]:
        if self._wire is not None:
            return await self._wire.ack_many(batch)
        return await self.outcomes.ack_many(batch, self.group)
