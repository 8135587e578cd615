"""What a worker serves: its (tenant, queue) pairs and their streams, found again while
it runs.

A tenant's shards may grow while the worker runs (its limit `shards`: the streams of
every shard it has used are read, store/placement.py): `Served` reads its tenants'
shards again every SHARDS_REFRESH_S and adds the new streams (its consumer group made on
each from the stream's start, so nothing already there is missed). Tenant patterns
(runs/patterns.py) are matched against the tenant registry again every
`tenants_refresh_s`; the pairs of tenants registered meanwhile join the same way.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence

import structlog

from timewheel.errors import RedisUnavailable
from timewheel.runs.delivery import Delivery
from timewheel.runs.metrics import PairStats
from timewheel.runs.outcomes import Outcomes
from timewheel.runs.patterns import TENANTS_REFRESH_S, matching, registered_tenants
from timewheel.store.shard import Store

log = structlog.get_logger("timewheel.worker")

SHARDS_REFRESH_S = 2.0
"""How often the worker reads its tenants' shards again (new shards' streams are read
within about this long of a change)."""


class Pair:
    """One (tenant, queue) a worker serves: its streams, its stats, and its runs held."""

    __slots__ = ("active", "busy", "cap", "held", "queue", "stats", "streams", "tenant")

    def __init__(self, tenant: str, queue: str, streams: list[str], stats: PairStats) -> None:
        self.tenant = tenant
        self.queue = queue
        self.streams = streams
        self.stats = stats
        self.busy = True
        """Whether its last read filled a stream's count (so more is likely waiting)."""
        self.active = 0
        """Its runs given to the runners whose handler has not finished (waiting for a
        slot, or running)."""
        self.held: deque[Delivery] = deque()
        """Its runs read and held back while `active` is at `cap` (runs/runners.py)."""
        self.cap = 0
        """Its share of the handler slots while other pairs are busy too (0: none)."""

    @property
    def outstanding(self) -> int:
        """Its runs read whose handler has not finished (held back, or given)."""
        return self.active + len(self.held)


class Served:
    """The pairs served, the pair of each stream, and the streams' consumer groups."""

    def __init__(
        self,
        store: Store,
        outcomes: Outcomes,
        group: str,
        pairs: list[Pair],
        *,
        patterns: Sequence[tuple[str, str]] = (),
        new_pair: Callable[[str, str], Pair] | None = None,
        tenants_refresh_s: float = TENANTS_REFRESH_S,
    ) -> None:
        self.store = store
        self.outcomes = outcomes
        self.group = group
        self.pairs = pairs
        self.stream_pair: dict[str, Pair] = {s: p for p in pairs for s in p.streams}
        """The pair of each stream read, shared with the reader, the runners and the
        recorder (changed in place as streams are added)."""
        self.streams = list(self.stream_pair)
        self.patterns = list(patterns)
        """(tenant pattern, queue): the pairs of the registered tenants they match are
        served too (refresh_tenants)."""
        self._new_pair = new_pair
        self.tenants_refresh_s = tenants_refresh_s
        self.cap = 0
        """The share of the handler slots a pair added now starts with (Reader.share_slots)."""
        self.groups_ready = False
        self._next_shards = 0.0
        """When the tenants' shards are read again (refresh_shards)."""
        self._next_tenants = 0.0
        """When the tenant registry is matched again (refresh_tenants)."""

    async def ensure_groups(self) -> None:
        """Create the consumer group on each stream (from its start, so nothing is missed)."""
        if self.patterns:
            await self.refresh_tenants()
        await self.refresh_shards()
        for stream in self.streams:
            await self.outcomes.register_group(stream, self.group)
        self.groups_ready = True

    async def refresh_tenants(self) -> None:
        """Match the tenant patterns against the registry again and serve the pairs of
        the tenants new to the worker."""
        self._next_tenants = time.monotonic() + self.tenants_refresh_s
        served = {(p.tenant, p.queue) for p in self.pairs}
        found = matching(await registered_tenants(self.store), self.patterns)
        new = [pair for pair in found if pair not in served]
        if not new:
            return
        assert self._new_pair is not None
        for tenant, queue in new:
            await self.add_pair(self._new_pair(tenant, queue))
        log.info("worker_pairs_added", pairs=[f"{t}/{q}" for t, q in new])

    async def add_pair(self, pair: Pair) -> None:
        """Serve one more pair: its streams read from now on (each with its consumer
        group made first, once the worker's groups are)."""
        if self.groups_ready:
            for stream in pair.streams:
                await self.outcomes.register_group(stream, self.group)
        pair.cap = self.cap
        self.pairs.append(pair)
        self.stream_pair.update(dict.fromkeys(pair.streams, pair))
        self.streams = list(self.stream_pair)

    async def refresh_shards(self) -> None:
        """Read the tenants' shards again; add the streams of shards new to the worker,
        each with its consumer group made first."""
        self._next_shards = time.monotonic() + SHARDS_REFRESH_S
        if not self.pairs:
            return
        tenants = list(dict.fromkeys(p.tenant for p in self.pairs))
        found = await self.store.placements.load_many(tenants, fresh=True)
        used = dict(zip(tenants, (p.used for p in found), strict=True))
        keys = self.store.keys
        added = [
            (pair, stream)
            for pair in self.pairs
            for stream in (keys.stream(s, pair.tenant, pair.queue) for s in used[pair.tenant])
            if stream not in self.stream_pair
        ]
        for pair, stream in added:
            if self.groups_ready:
                await self.outcomes.register_group(stream, self.group)
            pair.streams.append(stream)
            self.stream_pair[stream] = pair
        if added:
            self.streams = list(self.stream_pair)
            if self.groups_ready:  # a change while running (not the first read of them)
                log.info("worker_streams_added", streams=[s for _, s in added])

    async def refresh_if_due(self) -> None:
        """The two refreshes above, each when its time has come; a failed one is logged
        and tried again at its next time."""
        now = time.monotonic()
        if self.patterns and now >= self._next_tenants:
            try:
                await self.refresh_tenants()
            except RedisUnavailable as exc:
                log.warning("tenants_read_failed", error=str(exc))
        if now < self._next_shards:
            return
        try:
            await self.refresh_shards()
        except RedisUnavailable as exc:
            log.warning("shards_read_failed", error=str(exc))
