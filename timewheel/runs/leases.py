"""The worker's lease keeper: extends the leases of the runs it holds, by heartbeat.

A run read is held until its outcome is recorded (or given up on); while held, its
entry's idle time is reset every third of its visibility timeout, so the reaper does not
retry it meanwhile. The keeper also keeps the process's estimate of Redis's clock fresh,
which dates each run's start lag.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any

import structlog

from timewheel.errors import RedisUnavailable
from timewheel.runs.delivery import Delivery
from timewheel.runs.inflight import InFlight
from timewheel.store.connection import UNREACHABLE
from timewheel.store.shard import Store

log = structlog.get_logger("timewheel.worker")

LEASE_TICK_S = 0.05
CLOCK_CHECK_S = 1.0
"""How often the lease keeper looks at the clock estimate (it reads TIME when the
estimate is older than store/clock.py's SYNC_EVERY_S)."""


class LeaseKeeper:
    """The leases of the runs a worker holds (by stream, then entry id), and the clock."""

    def __init__(self, store: Store, group: str, consumer: str, inflight: InFlight) -> None:
        self.store = store
        self.group = group
        self.consumer = consumer
        self._inflight = inflight
        self.leases: dict[str, dict[str, tuple[float, float]]] = {}
        """(next heartbeat, interval) per entry id, per stream: the runs held."""
        self.next_beat = float("inf")
        """The earliest next heartbeat of a run held."""
        self.default_beat_s = self.beat_s(None)
        self.offset_ms = 0.0
        """Redis's clock minus this process's monotonic clock, in ms (the estimate)."""

    def beat_s(self, timeout_ms: int | None) -> float:
        """A third of the visibility timeout: two heartbeats may be lost safely."""
        timeout = timeout_ms or self.store.settings.visibility_timeout_ms
        return max(0.05, timeout / 3000.0)

    def read_clock(self) -> None:
        """Take the offset of Redis's clock from the store's clock estimate."""
        self.offset_ms = self.store.clock.now_ms() - time.monotonic() * 1000.0

    def start_lag_s(self, delivery: Delivery, start: float) -> float:
        """Handler start minus due, on the Redis clock estimate (never before dispatch)."""
        redis_ms = max(start * 1000.0 + self.offset_ms, delivery.dispatched_ms)
        return (redis_ms - delivery.due_ms) / 1000.0

    def hold(self, deliveries: Sequence[Delivery], now: float) -> None:
        """Keep the leases of runs just read (`keep` extends them)."""
        leases, default = self.leases, self.default_beat_s
        usual = (now + default, default)
        earliest = min(self.next_beat, usual[0])
        for d in deliveries:
            lease = usual
            if d.visibility_timeout_ms is not None:
                beat = self.beat_s(d.visibility_timeout_ms)
                lease = (now + beat, beat)
                earliest = min(earliest, lease[0])
            entries = leases.get(d.stream)
            if entries is None:
                entries = leases[d.stream] = {}
            entries[d.entry_id] = lease
        self.next_beat = earliest
        self._inflight.owned += len(deliveries)

    def release(self, delivery: Delivery) -> None:
        """The run's outcome is recorded (or given up on): its lease is no longer ours."""
        entries = self.leases.get(delivery.stream)
        if entries is not None and entries.pop(delivery.entry_id, None) is not None:
            inflight = self._inflight
            inflight.owned -= 1
            if inflight.waiting is not None and inflight.room() >= inflight.read_min:
                inflight.wake_reader()

    def release_many(self, batch: Sequence[Delivery]) -> None:
        """`release` for a batch, the reader left for the caller to wake."""
        leases, released = self.leases, 0
        for d in batch:
            entries = leases.get(d.stream)
            if entries is not None and entries.pop(d.entry_id, None) is not None:
                released += 1
        self._inflight.owned -= released

    async def keep(self) -> None:
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
                self.read_clock()
            if now < self.next_beat:
                continue
            # Runs held while this pass awaits lower next_beat themselves (hold).
            self.next_beat = float("inf")
            for stream, entries in list(self.leases.items()):
                due: list[Any] = [eid for eid, (beat, _) in entries.items() if beat <= now]
                for eid in due:
                    interval = entries[eid][1]
                    entries[eid] = (now + interval, interval)
                if entries:
                    earliest = min(beat for beat, _ in entries.values())
                    self.next_beat = min(self.next_beat, earliest)
                if not due:
                    continue
                try:
                    await client.xclaim(stream, self.group, self.consumer, 0, due, justid=True)
                except UNREACHABLE as exc:
                    log.warning("heartbeat_failed", stream=stream, error=str(exc))
