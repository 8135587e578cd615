"""The worker's reader: reads its (tenant, queue) pairs' streams ahead of the handlers.

It reads as many runs as free handler slots plus the read-ahead (shared equally between
the streams read and rounded up, so a read may bring one run per stream more), so the
next batch is there when a slot frees. Once the streams were found empty it waits on all
of them at once (BLOCK), which may bring one run per stream. Pairs with work share each
read equally; the others get a small probe, in an order that rotates; the runs of one
read are interleaved across pairs before they reach the runners.

The pairs and streams it reads, and how they grow while the worker runs, are
runs/serving.py's (`Served`); a reader whose patterns match no tenant yet reads nothing
and looks again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import structlog

from timewheel.errors import RedisUnavailable
from timewheel.runs.delivery import Delivery, parse_entry
from timewheel.runs.inflight import InFlight
from timewheel.runs.leases import LeaseKeeper
from timewheel.runs.serving import Pair, Served
from timewheel.runs.wire import Wire
from timewheel.store.connection import TORN, UNREACHABLE, torn_connection
from timewheel.store.shard import Store

if TYPE_CHECKING:
    from timewheel.runs.runners import Runners

log = structlog.get_logger("timewheel.worker")

READ_BLOCK_MS = 200
"""How long a read waits for new runs once the streams were found empty (and so how
long a stop may wait for the read in flight)."""
CLUSTER_POLL_S = 0.05
"""On a Cluster, the pause between reads of idle streams (one read per stream: a
blocking read of one would hold back the others)."""
PREFETCH_GROWTH = 4
"""While handlers outpace the reads, the read-ahead grows up to this times `prefetch`."""
IDLE_POLL_S = 0.5
"""With tenant patterns that match no tenant yet: the pause between looks at the
registry's refresh time."""


class Reader:
    """Reads the pairs' streams as one consumer of one group, sizing its reads."""

    def __init__(
        self,
        store: Store,
        group: str,
        consumer: str,
        wire: Wire | None,
        served: Served,
        *,
        concurrency: int,
        prefetch: int,
        inflight: InFlight,
        keeper: LeaseKeeper,
        runners: Runners,
    ) -> None:
        self.store = store
        self.group = group
        self.consumer = consumer
        self._wire = wire
        """The bulk calls of runs/wire.py (standalone Redis only)."""
        self.served = served
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.prefetch_now = prefetch
        """The read-ahead now: from `prefetch` up to PREFETCH_GROWTH times it (adapt)."""
        self._last_full = self._last_full_before = False
        """Whether the last read came back with all it asked for (and the one before)."""
        self._inflight = inflight
        self._keeper = keeper
        self._runners = runners
        inflight.set_capacity(concurrency + prefetch)
        self._rotation = 0

    @property
    def pairs(self) -> list[Pair]:
        return self.served.pairs

    @property
    def stream_pair(self) -> dict[str, Pair]:
        return self.served.stream_pair

    @property
    def streams(self) -> list[str]:
        return self.served.streams

    async def read_streams(
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
        except TORN as exc:
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

    def plan(self, room: int) -> list[tuple[int, list[str]]]:
        """What to read for `room` runs: (count per stream, streams) items.

        Pairs whose last read filled a stream's count (busy) share the room equally. The
        others are probed with one run per stream: as many as fit in half the room (at
        least one pair), taken round robin from where the last read's probes stopped.
        With no pair busy, all share.

        While two pairs or more are busy, each has a share of the handler slots
        (`concurrency` over the busy pairs, rounded up: `Pair.cap`, which the runners
        keep, share_slots) and none holds more than its share of the room (handler
        slots and read-ahead) in runs read and not yet finished: a pair whose handlers
        are slow would otherwise take every slot in turn, as the fast pairs' runs finish
        and free theirs, and the fast pairs would wait on the slow one. A pair at its
        share of the room is not read until its runs finish (a read may bring it one run
        per stream past it: the runners hold those back). The plan is empty when every
        busy pair is at its share."""
        pairs = self.pairs
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
        self.share_slots(len(busy))
        cap = -(-self._inflight.capacity // len(busy)) if len(busy) > 1 else 0
        by_count: dict[int, list[str]] = {}
        for p in busy:
            streams = p.streams
            want = share if not cap else min(share, cap - p.outstanding)
            if want > 0:
                by_count.setdefault(max(1, -(-want // len(streams))), []).extend(streams)
        if probes:
            by_count.setdefault(1, []).extend(probes)
        return list(by_count.items())

    def share_slots(self, busy: int) -> None:
        """Give every pair its share of the handler slots for `busy` busy pairs (none for
        one), the runs a pair held back beyond a larger share let go."""
        cap = -(-self.concurrency // busy) if busy > 1 else 0
        if cap == self.served.cap:
            return
        self.served.cap = cap
        for p in self.pairs:
            p.cap = cap
            if p.held:
                self._runners.let_go(p)

    def learn(
        self, plan: Sequence[tuple[int, list[str]]], got: Sequence[tuple[str, int, Any]]
    ) -> None:
        """Mark the pairs read: busy if one of their streams gave its whole count."""
        if len(self.pairs) == 1:
            return
        for _, streams in plan:
            for s in streams:
                self.stream_pair[s].busy = False
        for stream, count, deliveries in got:
            if len(deliveries) >= count:
                self.stream_pair[stream].busy = True

    def interleave(self, got: list[tuple[str, int, list[Delivery]]]) -> list[Delivery]:
        """The runs of one read, alternating between pairs (and streams)."""
        if len(got) == 1:
            return got[0][2]
        if len({self.stream_pair[s] for s, _, _ in got}) == 1:
            return [d for _, _, ds in got for d in ds]
        return [d for row in itertools.zip_longest(*(ds for _, _, ds in got)) for d in row if d]

    def adapt(self, asked: int, got: int) -> None:
        """Size the read-ahead from what a read found when it came back.

        Two reads in a row that came back full, the second finding handler slots idle:
        the handlers finished the first read's runs before the second arrived, so read
        more at once (fewer, larger reads are cheaper for Redis, which fsyncs once per
        pass of its event loop). Runs read ahead still waiting for a slot: read less,
        down to `prefetch`. Handlers that keep their slots busy never grow it."""
        full, self._last_full = got >= asked, got >= asked
        if not self.prefetch:
            return
        outstanding = self._inflight.outstanding
        waiting = outstanding - self._runners.running_now()
        now = self.prefetch_now
        if full and self._last_full_before and outstanding < self.concurrency:
            now = min(now * 2, self.prefetch * PREFETCH_GROWTH)
        elif 2 * waiting >= now:
            now = max(self.prefetch, now // 2)
        if now != self.prefetch_now:
            self.prefetch_now = now
            self._inflight.set_capacity(self.concurrency + now)

    def _hand_over(self, got: list[tuple[str, int, list[Delivery]]]) -> None:
        """A read's runs: counted in their pairs, their leases held, to the runners."""
        pair_of, shared = self.stream_pair, bool(self.served.cap)
        if not shared:  # all go to the runners (else take counts them)
            for stream, _, ds in got:
                pair_of[stream].active += len(ds)
        deliveries = self.interleave(got)
        self._keeper.hold(deliveries, time.monotonic())
        self._runners.take(deliveries, shared)

    async def loop(self, stop: asyncio.Event) -> None:
        """Read until `stop` is set, giving the runs read to the runners."""
        inflight, served = self._inflight, self.served
        found = True
        while not stop.is_set():
            if not self.streams:  # patterns that match no tenant yet
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), IDLE_POLL_S)
                await served.refresh_if_due()
                continue
            room = inflight.room()
            if room < inflight.read_min and (inflight.outstanding or room <= 0):
                await inflight.wait_for_room()
                continue
            if not found:  # the streams were empty: wait on all of them at once
                plan = [(max(1, room // len(self.streams)), self.streams)]
            else:
                plan = self.plan(room)
                if not plan:  # every busy pair holds its share: wait for a handler to end
                    await inflight.wait_for_room()
                    continue
            block = READ_BLOCK_MS if not found else None
            self._last_full_before = self._last_full
            try:
                if not served.groups_ready:
                    await served.ensure_groups()
                got = await self.read_streams(plan, block)
                await served.refresh_if_due()
            except RedisUnavailable as exc:
                if "NOGROUP" in str(exc):  # streams gone (a restore, a flush): make them again
                    served.groups_ready = False
                log.warning("read_failed", error=str(exc))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.5)
                continue
            self.learn(plan, got)
            self.adapt(room, sum(len(ds) for _, _, ds in got))
            if got:
                self._hand_over(got)
            elif not found and self.store.is_cluster and len(self.streams) > 1:
                # Reads of several Cluster streams do not block: pause between polls.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), CLUSTER_POLL_S)
            found = bool(got)
