"""The scheduler loop: tick every shard when it has due runs, promote ahead of time, sleep.

This is the single-node loop: it ticks all shards unfenced. The tick script is atomic,
so even two loops on one shard could not dispatch a run twice; shard leases (a later
slice, DESIGN.md section 5) split the polling work between nodes and fence the
planner and reaper.

Sleep: until the earliest next due time of any shard (in the shards' own clock, read
from each tick's reply), capped at `poll_cap_ms`, or until a create publishes on the
wake channel that a shard's next due time moved earlier.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from timewheel.engine import Engine
from timewheel.errors import TimewheelError
from timewheel.models import PromoteResult, TickResult

log = structlog.get_logger("timewheel.scheduler")

EXPIRE_EVERY_MS = 10_000
CLOCK_JUMP_LOG_MS = 1_000


def _local_ms() -> float:
    return time.time() * 1000.0


@dataclass(slots=True)
class ShardState:
    """What the loop knows of one shard, in that shard's clock (Redis TIME, ms)."""

    next_tick_ms: float = 0.0
    next_promote_ms: float = 0.0
    next_expire_ms: float = 0.0


@dataclass(slots=True)
class Counters:
    ticks: int = 0
    dispatched: int = 0
    promoted: int = 0
    expired: int = 0
    errors: int = 0


@dataclass
class Scheduler:
    """Ticks, promotes and expires the given shards of one deployment."""

    engine: Engine
    shards: list[int] | None = None
    node: str = ""
    epoch: str = ""
    counters: Counters = field(default_factory=Counters)

    def __post_init__(self) -> None:
        shard_list = self.shards if self.shards is not None else range(self.engine.settings.shards)
        self.state = {s: ShardState() for s in shard_list}
        self.offset_ms = 0.0  # shard clock minus local clock, learned from tick replies
        self.woken = asyncio.Event()

    # -- one pass ---------------------------------------------------------------------

    def _shard_now(self) -> float:
        return _local_ms() + self.offset_ms

    async def run_once(self) -> int:
        """Promote, tick and expire every shard that is due now; returns runs dispatched."""
        now = self._shard_now()
        promote = [s for s, st in self.state.items() if st.next_promote_ms <= now]
        tick = [s for s, st in self.state.items() if st.next_tick_ms <= now]
        expire = [s for s, st in self.state.items() if st.next_expire_ms <= now]
        if promote:
            for res in await asyncio.gather(*(self._promote(s) for s in promote)):
                if isinstance(res, PromoteResult):
                    self._after_promote(res)
        dispatched = 0
        if tick:
            for ticked in await asyncio.gather(*(self._tick(s) for s in tick)):
                if isinstance(ticked, TickResult):
                    dispatched += ticked.dispatched
                    self._after_tick(ticked)
        for s in expire:
            self.state[s].next_expire_ms = now + EXPIRE_EVERY_MS
        if expire:
            await asyncio.gather(*(self._expire(s) for s in expire))
        return dispatched

    async def _tick(self, shard: int) -> TickResult | None:
        sent = _local_ms()
        try:
            res = await self.engine.tick(shard, node=self.node, epoch=self.epoch)
        except TimewheelError as exc:
            self._failed("tick", shard, exc)
            return None
        # The reply's now_ms was read between send and receive: take the midpoint.
        self.offset_ms = res.now_ms - (sent + _local_ms()) / 2
        self.counters.ticks += 1
        self.counters.dispatched += res.dispatched
        if res.clock_back_ms >= CLOCK_JUMP_LOG_MS:
            log.warning("clock_behind_high_water_mark", shard=shard, back_ms=res.clock_back_ms)
        return res

    def _after_tick(self, res: TickResult) -> None:
        st = self.state[res.shard]
        limit = self.engine.settings.tick_batch
        if res.consumed >= limit:
            st.next_tick_ms = 0.0  # a backlog is due now: come straight back
        elif res.next_due_ms is not None:
            st.next_tick_ms = float(res.next_due_ms)
        else:
            st.next_tick_ms = float("inf")
        self._plan_promote(st, res.promoted_until_ms, res.next_bucket_ms)

    def _plan_promote(self, st: ShardState, promoted_until: int, next_bucket: int | None) -> None:
        horizon = self.engine.settings.horizon_ms
        # Promote again once the horizon reaches promoted_until, or a bucket comes within
        # it (a bucket can appear before promoted_until only if promotion fell behind).
        when = promoted_until - horizon
        if next_bucket is not None:
            when = min(when, next_bucket - horizon)
        st.next_promote_ms = float(when)

    async def _promote(self, shard: int) -> PromoteResult | None:
        try:
            res = await self.engine.promote(shard, node=self.node, epoch=self.epoch)
        except TimewheelError as exc:
            self._failed("promote", shard, exc)
            return None
        self.counters.promoted += res.moved
        return res

    def _after_promote(self, res: PromoteResult) -> None:
        st = self.state[res.shard]
        if res.more:
            st.next_promote_ms = 0.0
        else:
            self._plan_promote(st, res.promoted_until_ms, res.next_bucket_ms)
        if res.moved:
            st.next_tick_ms = 0.0  # promoted runs may be due already (after downtime)

    async def _expire(self, shard: int) -> None:
        try:
            deleted, more = await self.engine.expire_finished(shard)
        except TimewheelError as exc:
            self._failed("expire", shard, exc)
            return
        self.counters.expired += deleted
        if more:
            self.state[shard].next_expire_ms = 0.0

    def _failed(self, op: str, shard: int, exc: TimewheelError) -> None:
        self.counters.errors += 1
        log.warning("scheduler_call_failed", op=op, shard=shard, error=str(exc))
        st = self.state[shard]
        retry_at = self._shard_now() + 200
        if op == "tick":
            st.next_tick_ms = retry_at
        elif op == "promote":
            st.next_promote_ms = retry_at

    # -- the loop ---------------------------------------------------------------------

    def _sleep_s(self) -> float:
        earliest = min(
            (
                min(st.next_tick_ms, st.next_promote_ms, st.next_expire_ms)
                for st in self.state.values()
            ),
            default=float("inf"),
        )
        wait_ms = min(earliest - self._shard_now(), float(self.engine.settings.poll_cap_ms))
        return max(wait_ms, 0.0) / 1000.0

    def wake(self, shard: int) -> None:
        """Tick `shard` at once (called for wake-up messages)."""
        st = self.state.get(shard)
        if st is not None:
            st.next_tick_ms = 0.0
            st.next_promote_ms = min(st.next_promote_ms, self._shard_now())
            self.woken.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Run until `stop` is set; the pass in progress finishes first."""
        listener = asyncio.create_task(self._listen_for_wakeups(stop))
        log.info("scheduler_started", shards=len(self.state), node=self.node or None)
        try:
            while not stop.is_set():
                await self.run_once()
                delay = self._sleep_s()
                if delay <= 0:
                    await asyncio.sleep(0)
                    continue
                self.woken.clear()
                sleeper = asyncio.create_task(self.woken.wait())
                stopper = asyncio.create_task(stop.wait())
                await asyncio.wait({sleeper, stopper}, timeout=delay, return_when="FIRST_COMPLETED")
                sleeper.cancel()
                stopper.cancel()
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
            log.info("scheduler_stopped", dispatched=self.counters.dispatched)

    async def _listen_for_wakeups(self, stop: asyncio.Event) -> None:
        # A plain connection to the URL's node: PUBLISH reaches every node of a Cluster.
        channel = self.engine.keys.wake_channel()
        while not stop.is_set():
            client = aioredis.Redis.from_url(self.engine.settings.redis_url)
            try:
                async with client.pubsub() as pubsub:
                    await pubsub.subscribe(channel)
                    while not stop.is_set():
                        msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                        if msg and msg.get("type") == "message":
                            with contextlib.suppress(ValueError):
                                self.wake(int(msg["data"]))
            except (RedisError, OSError) as exc:
                log.warning("wake_listener_failed", error=str(exc))
                await asyncio.sleep(0.5)
            finally:
                await client.aclose()


async def run_scheduler(engine: Engine, stop: asyncio.Event) -> Scheduler:
    """Run a single-node scheduler over all shards until `stop` is set."""
    scheduler = Scheduler(engine)
    await scheduler.run(stop)
    return scheduler


__all__ = ["Scheduler", "run_scheduler"]
