"""Tenant limits: what applies to a tenant (its own value, else the deployment's
default), and what the tenant holds, checked before anything is written.

What a tenant holds is counted with the data: every shard keeps a HASH per tenant,
`{tw:N}:use:<tenant>` (lua/lib/usage.lua), changed in the same Lua call that creates,
cancels, finishes, buries, replays, purges or deletes what it counts, so a count cannot
drift from the data by a crash between two writes: `q:<queue>` for each queue in use
(its runs not finished, that is scheduled, in flight or waiting for a retry, and its
schedules), `schedules`, and `bytes`, the payload bytes held (those runs, dead letters,
schedules). The runs not finished are the q:* counts less schedules. The dispatch tick
does not touch it: a run sent is still a run not finished.

`Limiter` reads those hashes over the tenant's shards in one round trip, keeps the sum
for CACHE_TTL_S per api process, adds what this process wrote since, and refuses a
create that would pass a limit before it is written (OverLimit, HTTP 429). So a check
sees what every process wrote up to a second ago plus its own writes: creates through
several api processes at once can pass a limit by what they write within that second;
within one process, by the creates in flight at the same moment.

`max_pending` is also enforced where it cannot be passed: each call adding counted runs
carries a cap per tenant (`Limiter.cap`), the most runs not finished its shard may hold,
and lua/task_create.lua (schedule_add_runs.lua, dead_replay.lua) refuses what would pass
it (the same OverLimit). The caps of
a tenant's current shards share what its older shards (of an earlier spread) leave of
max_pending: those only lose runs, so the count read from them, however old, is at
least what they hold, and the caps of all shards add up to at most max_pending. With
one shard the cap is max_pending less what older shards hold: the limit is exact.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

from redis.exceptions import RedisError

from timewheel.config import Settings
from timewheel.errors import OverLimit, RedisUnavailable, ValidationError
from timewheel.schedules.interval import shortest_interval_s
from timewheel.schedules.spec import ScheduleSpec
from timewheel.store.shard import Store
from timewheel.tenants import CACHE_TTL_S, Limits, Tenant

RETRY_AFTER_S = 1
"""Retry-After of a refusal that frees itself as the tenant's runs finish: the count a
check reads is at most CACHE_TTL_S old."""
MAX_CACHED = 10_000
"""Most tenants whose usage one process keeps (the cache starts again past it)."""


@dataclass(frozen=True, slots=True)
class Effective:
    """The limits that apply to a tenant: its own where set, else the deployment's."""

    max_payload_bytes: int
    max_pending: int
    max_payload_total_bytes: int
    max_schedules: int
    max_queues: int
    min_interval_s: float

    @classmethod
    def of(cls, limits: Limits, settings: Settings) -> Effective:
        def pick(own: Any, default: Any) -> Any:
            return default if own is None else own

        return cls(
            max_payload_bytes=pick(limits.max_payload_bytes, settings.max_payload_bytes),
            max_pending=pick(limits.max_pending, settings.tenant_max_pending),
            max_payload_total_bytes=pick(
                limits.max_payload_total_bytes, settings.tenant_max_payload_total_bytes
            ),
            max_schedules=pick(limits.max_schedules, settings.tenant_max_schedules),
            max_queues=pick(limits.max_queues, settings.tenant_max_queues),
            min_interval_s=pick(limits.min_interval_s, settings.tenant_min_interval_s),
        )


NONE: Mapping[str, int] = MappingProxyType({})
NONE_BY_SHARD: Mapping[int, int] = MappingProxyType({})


class Usage(NamedTuple):
    """What a tenant holds, or a change to it (negative values take away). A tuple: one
    is made for every create, and a tuple is made in a fraction of a dataclass's time."""

    runs: int = 0
    bytes: int = 0
    schedules: int = 0
    queues: Mapping[str, int] = NONE
    """queue -> what holds it (runs not finished and schedules of that queue)."""

    def plus(self, change: Usage) -> Usage:
        """What is held after `change` (no count below 0; a queue at 0 is not in use)."""
        queues = dict(self.queues)
        for name, n in change.queues.items():
            queues[name] = queues.get(name, 0) + n
        if all(n > 0 for n in queues.values()):
            return Usage(
                max(0, self.runs + change.runs),
                max(0, self.bytes + change.bytes),
                max(0, self.schedules + change.schedules),
                queues,
            )
        return Usage(
            max(0, self.runs + change.runs),
            max(0, self.bytes + change.bytes),
            max(0, self.schedules + change.schedules),
            {name: n for name, n in queues.items() if n > 0},
        )

    @classmethod
    def from_hash(cls, raw: Mapping[Any, Any]) -> Usage:
        """One shard's `use:<tenant>` hash (lua/lib/usage.lua): its runs not finished
        are what holds its queues less its schedules."""
        counts = {_text(k): int(v) for k, v in raw.items()}
        queues = {k[2:]: n for k, n in counts.items() if k.startswith("q:") and n > 0}
        schedules = counts.get("schedules", 0)
        return cls(
            max(0, sum(queues.values()) - schedules),
            counts.get("bytes", 0),
            schedules,
            queues,
        )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def runs_of(payload_jsons: list[str], queues: list[str]) -> Usage:
    """What creating runs with these payloads in these queues adds."""
    if len(queues) == 1:
        return Usage(1, len(payload_jsons[0].encode()), 0, {queues[0]: 1})
    held: dict[str, int] = {}
    for queue in queues:
        held[queue] = held.get(queue, 0) + 1
    return Usage(len(payload_jsons), sum(len(p.encode()) for p in payload_jsons), 0, held)


class Held(Protocol):
    """What a tenant holds, as a check reads it (a Usage, or the cache's running sum)."""

    @property
    def runs(self) -> int: ...
    @property
    def bytes(self) -> int: ...
    @property
    def schedules(self) -> int: ...
    @property
    def queues(self) -> Mapping[str, int]: ...


class _Cached:
    """A tenant's usage as read, plus this process's writes since (changed in place: a
    create notes one); `by_shard` keeps each shard's runs not finished as read, and
    `shards` the tenant's current shards (its placement) when it was read. `noted`: a
    write was added since the read (which the read may have counted already)."""

    __slots__ = (
        "by_shard",
        "bytes",
        "expires",
        "noted",
        "queues",
        "runs",
        "schedules",
        "shards",
    )

    def __init__(
        self,
        usage: Usage,
        expires: float,
        by_shard: Mapping[int, int] = NONE_BY_SHARD,
        shards: tuple[int, ...] = (),
    ):
        self.expires = expires
        self.by_shard = by_shard
        self.shards = shards
        self.runs, self.bytes, self.schedules = usage.runs, usage.bytes, usage.schedules
        self.queues: dict[str, int] = dict(usage.queues)
        self.noted = False

    def add(self, change: Usage) -> None:
        self.noted = True
        self.runs = max(0, self.runs + change.runs)
        self.bytes = max(0, self.bytes + change.bytes)
        self.schedules = max(0, self.schedules + change.schedules)
        for name, n in change.queues.items():
            left = self.queues.get(name, 0) + n
            if left > 0:
                self.queues[name] = left
            else:
                self.queues.pop(name, None)


def over(limits: Effective, held: Held, adding: Usage) -> OverLimit | None:
    """The refusal of `adding` to what the tenant holds, or None if it fits."""
    new = [q for q, n in adding.queues.items() if n > 0 and q not in held.queues]
    queues_after = len(held.queues) + len(new)
    for name, n in adding.queues.items():  # a change may free a queue (a schedule moving)
        if n < 0 and 0 < held.queues.get(name, 0) <= -n:
            queues_after -= 1
    if adding.runs > 0 and held.runs + adding.runs > limits.max_pending:
        return OverLimit(
            f"the tenant has {held.runs} runs not finished; {adding.runs} more would pass "
            f"max_pending {limits.max_pending}",
            retry_after_s=RETRY_AFTER_S,
            field="max_pending",
        )
    if adding.bytes > 0 and held.bytes + adding.bytes > limits.max_payload_total_bytes:
        return OverLimit(
            f"the tenant holds {held.bytes} payload bytes; {adding.bytes} more would pass "
            f"max_payload_total_bytes {limits.max_payload_total_bytes}",
            retry_after_s=RETRY_AFTER_S,
            field="max_payload_total_bytes",
        )
    if new and queues_after > limits.max_queues:
        return OverLimit(
            f"the tenant uses {len(held.queues)} queues; queue {min(new)!r} would pass "
            f"max_queues {limits.max_queues}",
            retry_after_s=RETRY_AFTER_S,
            field="max_queues",
        )
    if adding.schedules > 0 and held.schedules + adding.schedules > limits.max_schedules:
        return OverLimit(
            f"the tenant has {held.schedules} schedules; max_schedules is "
            f"{limits.max_schedules} (delete one first)",
            retry_after_s=None,
            field="max_schedules",
        )
    return None


async def check_interval(spec: ScheduleSpec, limits: Effective) -> None:
    """Raise ValidationError (422) naming `cron` or `every_s` if the schedule fires more
    often than min_interval_s. A cron's interval is worked out off the event loop."""
    shortest = await asyncio.to_thread(shortest_interval_s, spec)
    if shortest < limits.min_interval_s:
        name = "every_s" if spec.every_s is not None else "cron"
        raise ValidationError(
            f"the schedule fires {shortest:g} s apart at its closest; the tenant's "
            f"min_interval_s is {limits.min_interval_s:g}",
            field=name,
            code="interval_too_short",
        )


class Limiter:
    """Checks tenants' creates against their limits, from usage cached per process."""

    def __init__(self, store: Store):
        self.store = store
        self._cache: dict[str, _Cached] = {}
        self._reads: dict[str, asyncio.Future[_Cached]] = {}
        self._effective: dict[str, tuple[Limits, Effective]] = {}

    def limits(self, tenant: Tenant) -> Effective:
        """The limits that apply to the tenant, worked out again only when its Limits
        are another object (the tenant store reads them again at most once a second)."""
        hit = self._effective.get(tenant.id)
        if hit is not None and hit[0] is tenant.limits:
            return hit[1]
        if len(self._effective) >= MAX_CACHED:
            self._effective.clear()
        found = Effective.of(tenant.limits, self.store.settings)
        self._effective[tenant.id] = (tenant.limits, found)
        return found

    async def read(self, tenant_id: str) -> Usage:
        """What the tenant holds now, summed over its shards (one round trip)."""
        return (await self._read(tenant_id))[0]

    async def _read(self, tenant_id: str) -> tuple[Usage, dict[int, int], tuple[int, ...]]:
        """What the tenant holds, each shard's runs not finished, and the tenant's
        current shards as the read found them."""
        keys = self.store.keys
        try:
            placement = await self.store.placements.load(tenant_id)
            shards = list(placement.used)
            pipe = self.store.client.pipeline(transaction=False)
            for shard in shards:
                pipe.hgetall(keys.usage(shard, tenant_id))
            replies: list[Any] = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"cannot read the tenant's usage: {exc}") from exc
        total, by_shard = Usage(), {}
        for shard, raw in zip(shards, replies, strict=True):
            usage = Usage.from_hash(raw)
            by_shard[shard] = usage.runs
            total = total.plus(usage)
        return total, by_shard, placement.shards

    async def usage(self, tenant_id: str) -> Held:
        """What the tenant holds, at most CACHE_TTL_S old plus this process's writes.
        Concurrent callers share one read. A read made under another placement than the
        one this process knows now is read again (its caps would count shards that were
        current then as older ones: `cap`)."""
        hit = self._cache.get(tenant_id)
        if (
            hit is not None
            and hit.expires > time.monotonic()
            and hit.shards == self.store.placements.get(tenant_id).shards
        ):
            return hit
        pending = self._reads.get(tenant_id)
        if pending is None:
            pending = asyncio.ensure_future(self._refresh(tenant_id))
            self._reads[tenant_id] = pending
        return await asyncio.shield(pending)

    async def _refresh(self, tenant_id: str) -> _Cached:
        try:
            return await self._refresh_now(tenant_id)
        finally:
            self._reads.pop(tenant_id, None)

    async def _refresh_now(self, tenant_id: str) -> _Cached:
        """A read sent now (not one under way, which may have been sent before writes
        this process has noted since), kept as the tenant's count."""
        usage, by_shard, shards = await self._read(tenant_id)
        cached = _Cached(usage, time.monotonic() + CACHE_TTL_S, by_shard, shards)
        if len(self._cache) >= MAX_CACHED:
            self._cache.clear()
        self._cache[tenant_id] = cached
        return cached

    async def check(self, tenant: Tenant, adding: Usage) -> None:
        """Raise OverLimit if `adding` would put the tenant over one of its limits.

        A count with this process's writes noted on it can run ahead of Redis: a write
        whose reply came back after a read was sent may be in that read and be noted on
        it again. So a refusal from such a count is made only after a read of its own
        (a tenant refused over and over, noting nothing, costs no read)."""
        limits = self.limits(tenant)
        held = await self.usage(tenant.id)
        refusal = over(limits, held, adding)
        if refusal is not None and isinstance(held, _Cached) and held.noted:
            refusal = over(limits, await self._refresh_now(tenant.id), adding)
        if refusal is not None:
            raise refusal

    def note(self, tenant_id: str, change: Usage) -> None:
        """Count a change this process wrote (a create, a cancel) until the next read."""
        hit = self._cache.get(tenant_id)
        if hit is not None:
            hit.add(change)

    def cap(self, tenant_id: str, shard: int) -> int | None:
        """The most runs not finished of the tenant that `shard` may hold after a create
        (lua/task_create.lua refuses a run past it), or None: no cap (a shard out of the
        tenant's current placement, or a tenant no check has read).

        What the tenant's older shards (out of its placement, from an earlier spread) held
        when last read is at least what they hold now: nothing adds to them but a trigger
        or backfill of a schedule that lives there, or a replay of a dead letter there,
        which get no cap (None) and are checked against the cached count only. The rest
        of max_pending is split over the current shards (`split`); so the caps add up to
        at most max_pending whatever each process read, and with one shard the cap is all
        that is left.
        """
        hit = self._effective.get(tenant_id)
        cached = self._cache.get(tenant_id)
        if hit is None or cached is None:
            return None
        placement = self.store.placements.get(tenant_id)
        current = placement.shards
        if shard not in current:
            return None
        if cached.shards != current:
            # Read under another placement (it changed since the check): what shards that
            # were current then held has grown since. Refuse until a read under this one.
            return 0
        older = 0
        for used in placement.used:
            if used in current:
                continue
            runs = cached.by_shard.get(used)
            if runs is None:  # not read (a placement newer than the read): no cap
                return None
            older += runs
        room = max(0, hit[1].max_pending - older)
        if len(current) == 1:
            return room
        return split(room, [cached.by_shard.get(s, 0) for s in current])[current.index(shard)]


def split(room: int, held: Sequence[int]) -> list[int]:
    """The caps of a tenant's current shards (in placement order) sharing `room`, given
    what each held when last read.

    Each shard's share is room / shards, the first ones taking one more for what does
    not divide. A shard that holds more than its cap (runs placed under an earlier,
    smaller spread) keeps a cap it is past, so it refuses, and all it holds is taken
    from the room of the others, split over them the same way (never above their
    shares); until no shard left holds past its cap. So what the shards can come to
    hold, each up to its cap or what it holds past it, is at most `room` (or what they
    hold already). A held count read earlier is at least what such a shard holds now,
    since no create adds to a shard at or past its cap.
    """
    width = len(held)
    base, extra = divmod(room, width)
    shares = [base + (1 if i < extra else 0) for i in range(width)]
    caps = list(shares)
    over: set[int] = set()
    while True:
        past = {i for i in range(width) if held[i] > caps[i]}
        if past <= over or len(over | past) == width:
            return caps
        over |= past
        rest = [i for i in range(width) if i not in over]
        left = max(0, room - sum(held[i] for i in over))
        base, extra = divmod(left, len(rest))
        for k, i in enumerate(rest):
            caps[i] = min(shares[i], base + (1 if k < extra else 0))
