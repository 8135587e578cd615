"""Redis's clock as this process sees it: the only clock that decides when anything runs.

Every shard's scripts read Redis TIME, so what is due is never a node's call. A process
still needs its own estimate of Redis's time to know when to call next (a scheduler's
tick, plan, reap and expire timers) and to compute fire times of schedules before it
writes them (the API). `RedisClock` keeps that estimate as an offset from this
process's monotonic clock, learned from every reply that carries Redis's time (a
tick, a node heartbeat, a TIME command), taking the midpoint of send and receive.

A monotonic base means a step of the node's wall clock, either way, changes nothing;
a fresh reply corrects whatever drift the offset has. The wall-clock skew (Redis time
minus this node's wall clock) is only reported: logged once it passes SKEW_LOG_MS and
exported as timewheel_clock_offset_seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog
from redis.exceptions import RedisError

from timewheel.errors import RedisUnavailable
from timewheel.store.connection import RedisClient

log = structlog.get_logger("timewheel.clock")

SKEW_LOG_MS = 1_000.0
"""A node whose wall clock is further than this from Redis's says so in its log."""
SYNC_EVERY_S = 5.0
"""How old an estimate `now_ms_fresh` accepts before it reads TIME again."""
AGING_MS_PER_S = 1.0
"""How fast an estimate's bound widens: far above a monotonic clock's drift (tens of
ppm), so fresh samples of an ordinary round trip keep replacing it."""


def monotonic_ms() -> float:
    return time.monotonic() * 1000.0


def wall_ms() -> float:
    return time.time() * 1000.0


class RedisClock:
    """This process's estimate of Redis TIME, in ms. One per process (or per Store)."""

    def __init__(
        self,
        monotonic: Callable[[], float] = monotonic_ms,
        wall: Callable[[], float] = wall_ms,
    ) -> None:
        self._monotonic = monotonic
        self._wall = wall
        self._offset_ms: float | None = None
        """Redis ms minus monotonic ms; None until the first reply."""
        self._observed_at = 0.0
        """Monotonic ms of the sample the estimate is from."""
        self._half_rtt = 0.0
        """Half the round trip of that sample: how far off it can be."""
        self.skew_ms = 0.0
        """Redis time minus this node's wall clock, at the last observation."""
        self._skew_logged = False

    @property
    def known(self) -> bool:
        return self._offset_ms is not None

    def now_ms(self) -> float:
        """Redis's time now, as last learned (this node's wall clock before any reply)."""
        if self._offset_ms is None:
            return self._wall()
        return self._monotonic() + self._offset_ms

    def sent(self) -> float:
        """A send time to hand back to `observe` with the reply."""
        return self._monotonic()

    def observe(self, redis_ms: float, sent: float, received: float | None = None) -> None:
        """Learn from a reply: Redis read `redis_ms` between `sent` and `received`
        (values of `sent()`; received defaults to now).

        Redis read its time somewhere in the round trip, so a sample is good to half its
        round trip. A sample replaces the estimate if it is tighter than the estimate's
        own bound (half the round trip it came from, widened by AGING_MS_PER_S since), or
        if it contradicts that bound (the base clock moved): a slow reply (a connection
        being set up, a long pipeline) does not spoil a good estimate."""
        got = self._monotonic() if received is None else received
        half_rtt = max(0.0, got - sent) / 2
        offset = redis_ms - (sent + got) / 2
        if self._offset_ms is not None:
            bound = self._half_rtt + (got - self._observed_at) / 1000.0 * AGING_MS_PER_S
            consistent = abs(offset - self._offset_ms) <= bound + half_rtt
            if consistent and half_rtt > bound:
                return
        self._offset_ms = offset
        self._half_rtt = half_rtt
        self._observed_at = got
        self.skew_ms = redis_ms - (self._wall() - half_rtt)
        far = abs(self.skew_ms) > SKEW_LOG_MS
        if far and not self._skew_logged:
            log.warning("clock_skew", skew_ms=round(self.skew_ms), threshold_ms=SKEW_LOG_MS)
        elif not far and self._skew_logged:
            log.info("clock_skew_gone", skew_ms=round(self.skew_ms))
        self._skew_logged = far

    def age_s(self) -> float:
        """Seconds since the last observation (inf before any)."""
        if self._offset_ms is None:
            return float("inf")
        return (self._monotonic() - self._observed_at) / 1000.0

    async def sync(self, client: RedisClient) -> float:
        """Read Redis TIME now (twice: the first read may pay for a new connection);
        returns Redis's time in ms. Raises RedisUnavailable."""
        redis_ms = 0.0
        for _ in range(2):
            sent = self.sent()
            try:
                sec, usec = await client.time()
            except (RedisError, OSError) as exc:
                raise RedisUnavailable(f"TIME failed: {exc}") from exc
            redis_ms = int(sec) * 1000 + int(usec) / 1000
            self.observe(redis_ms, sent)
        return redis_ms

    async def now_ms_fresh(self, client: RedisClient) -> int:
        """Redis's time, from an estimate at most SYNC_EVERY_S old (else TIME is read)."""
        if self.age_s() > SYNC_EVERY_S:
            return int(await self.sync(client))
        return int(self.now_ms())
