"""The one way Python calls a Lua operation: a typed `Call` run by a `Store`.

Each operation module builds its calls with named arguments (tasks/ops.py builds
task_create, dispatch/tick.py builds dispatch_tick, ...) and gives each one the decoder
of that script's reply, which returns a dataclass. A `Store` holds what every call
needs: the connection, the key names, the loaded library and the settings, and builds
the trailing arguments most scripts share in one place (`Store.shared`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError, ResponseError

from timewheel import ids
from timewheel.config import Settings
from timewheel.errors import RedisUnavailable, TaskNotFound
from timewheel.store import bodies, deployment
from timewheel.store.bodies import BodyLayout
from timewheel.store.clock import RedisClock
from timewheel.store.connection import TORN, UNREACHABLE, RedisClient, connect, torn_connection
from timewheel.store.guard import StorageGuard
from timewheel.store.keys import Keys
from timewheel.store.library import Script, ScriptArg, Scripts
from timewheel.store.pipeline import Lane, run_pipeline
from timewheel.store.placement import Placements
from timewheel.store.replication import ReplicaWait

R = TypeVar("R")


@dataclass(slots=True)
class Call(Generic[R]):
    """One call of a Lua operation: its function, KEYS and ARGV, and its reply decoder.
    Not frozen, though nothing changes one: a frozen dataclass sets each field through
    object.__setattr__, some 1,100 instructions a field, on every call made."""

    script: Script
    keys: list[str]
    args: list[ScriptArg]
    decode: Callable[[Any], R]
    head: int = 0
    """How many of the first ARGV values repeat from call to call of this script and
    KEYS (a shard's shared arguments, say): a lane packs them once (pipeline.Lane.pack)."""


RECORDS_PER_CALL = 1000
"""Run ids per lua/archive_records.lua call (its header's limit)."""


def _raw_records(reply: list[Any]) -> list[Any]:
    """archive_records.lua's reply: a record (bytes) or None per run."""
    return reply


def clock_arg(now_ms: int | None) -> ScriptArg:
    """The clock override scripts take: '' means the server's TIME (every real call)."""
    return "" if now_ms is None else now_ms


class Store:
    """One deployment's Redis (standalone or Cluster) and everything a call needs."""

    def __init__(self, client: RedisClient, settings: Settings, scripts: Scripts | None = None):
        self.client = client
        self.settings = settings
        self.keys = Keys(settings.prefix)
        self.scripts = scripts or Scripts()
        self.is_cluster = isinstance(client, RedisCluster)
        self.replica_wait = ReplicaWait(
            max(settings.min_replicas_ack, 0),
            settings.replica_wait_ms,
            strict=settings.min_replicas_ack >= 0,
        )
        """Replicas a client's write waits for (WAIT) before it is answered
        (store/replication.py)."""
        self.clock = RedisClock()
        """This process's estimate of Redis's time (store/clock.py)."""
        self.guard = StorageGuard(client, settings, self.keys)
        """What a create asks before it writes (StorageFull near the memory ceiling)."""
        self.lane = None if isinstance(client, RedisCluster) else Lane(client)
        """Kept connections for the packed calls of a standalone Redis (store/pipeline.py)."""
        self.placements = Placements(client, self.keys, settings)
        """Tenants' shards as last read (store/placement.py)."""
        self.body_layouts: dict[int, BodyLayout] = {}
        """Shards' body layouts as last read (store/bodies.py): a reader that guessed by
        one reads the layout after the record in the same round trip to check it."""

    @classmethod
    async def connect(cls, settings: Settings) -> Store:
        """Connect, check the deployment layout, and count the replicas to wait for."""
        store = cls(await connect(settings.redis_url), settings)
        try:
            await deployment.ensure_layout(store.client, settings, store.scripts.library.name)
            if settings.min_replicas_ack < 0:  # auto: one where a primary has replicas
                counts = await deployment.replica_counts(store.client)
                wait = store.replica_wait
                wait.count = min(1, max(counts.values(), default=0))
                for name, count in counts.items():
                    if count == 0 and wait.count:
                        wait.mark_solo(name)
        except BaseException:
            await store.close()
            raise
        return store

    async def close(self) -> None:
        if self.lane is not None:
            await self.lane.close()
        await self.client.aclose()

    async def ping(self) -> bool:
        try:
            return bool(await self.client.ping())
        except UNREACHABLE:
            return False

    # -- placement ---------------------------------------------------------------------

    def shards_of(self, tenant: str) -> list[int]:
        """The shards that may hold a tenant's tasks and ready streams (every shard it
        has used), as last read: `tenant_shards` reads them when that is stale."""
        return list(self.placements.get(tenant).used)

    async def tenant_shards(self, tenant: str) -> list[int]:
        """Every shard that may hold the tenant's tasks, at most CACHE_TTL_S old."""
        return list((await self.placements.load(tenant)).used)

    def shard_for(self, tenant: str, token: str) -> int:
        """The shard of a new task or schedule of the tenant (its placement as last
        read; a create loads it first)."""
        return self.placements.get(tenant).shard_for(token)

    def locate(self, run_id: str) -> int:
        """The shard of a task, run or schedule id. Raises TaskNotFound for a malformed
        id or one past this deployment's shards."""
        shard = ids.shard_of(run_id)
        if shard is None or shard >= self.settings.shards:
            raise TaskNotFound(run_id)
        return shard

    def shared(self, shard: int, now_ms: int | None, *, wake: bool = True) -> list[ScriptArg]:
        """The trailing arguments most scripts take, in their order: bucket width, clock
        override, event log cap, and (with `wake`) the wake channel and the shard."""
        s = self.settings
        tail: list[ScriptArg] = [s.bucket_ms, clock_arg(now_ms), s.event_log_max]
        if wake:
            tail += [self.keys.wake_channel(), shard]
        return tail

    # -- records -----------------------------------------------------------------------

    async def body_layout(self, shard: int) -> BodyLayout:
        """The shard's body layout (store/bodies.py), read now."""
        try:
            values = await self.client.hmget(self.keys.meta(shard), list(bodies.META_FIELDS))
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"cannot read the body layout: {exc}") from exc
        layout = self.body_layouts[shard] = BodyLayout.read(values)
        return layout

    async def record_key(self, run_id: str) -> tuple[str, str]:
        """(body hash, field) of a run's record as its shard's layout is now: for
        operators' tools and tests that read or write a record directly."""
        shard = self.locate(run_id)
        layout = await self.body_layout(shard)
        return layout.place(self.keys.tag(shard), run_id)

    async def records(self, runs: Sequence[tuple[int, str]]) -> list[bytes | None]:
        """The stored record of each (shard, run id), None where there is none: one
        lua/archive_records.lua call per shard and RECORDS_PER_CALL runs, which place
        each run by its shard's body layout as it is."""
        by_shard: dict[int, list[int]] = {}
        for i, (shard, _) in enumerate(runs):
            by_shard.setdefault(shard, []).append(i)
        chunks = [
            (shard, wanted[i : i + RECORDS_PER_CALL])
            for shard, wanted in by_shard.items()
            for i in range(0, len(wanted), RECORDS_PER_CALL)
        ]
        calls = [
            Call(
                self.scripts.archive_records,
                [self.keys.meta(shard)],
                [runs[i][1] for i in chunk],
                _raw_records,
            )
            for shard, chunk in chunks
        ]
        out: list[bytes | None] = [None] * len(runs)
        for (_, chunk), raws in zip(chunks, await self.run_many(calls), strict=True):
            for i, raw in zip(chunk, raws, strict=True):
                out[i] = raw if isinstance(raw, bytes) else None
        return out

    # -- running calls -----------------------------------------------------------------

    async def run(self, call: Call[R]) -> R:
        """Run one call and decode its reply; connection failures are RedisUnavailable."""
        try:
            reply = await call.script(self.client, call.keys, call.args)
        except UNREACHABLE as exc:
            if "timewheel:" in str(exc):
                raise
            raise RedisUnavailable(f"{call.script.name} failed: {exc}") from exc
        except TORN as exc:
            if not torn_connection(exc):
                raise
            raise RedisUnavailable(f"{call.script.name} failed: connection lost ({exc})") from exc
        return call.decode(reply)

    async def write(self, call: Call[R]) -> R:
        """A client's change (create, cancel, reschedule): one call, answered only once
        `replicas_ack` replicas have it (store/replication.py).

        On standalone Redis it is packed and sent on the store's lane (a create costs its
        caller less than half the CPU it did through redis-py: bench/engine_create.py);
        errors are the same either way: a script's 'timewheel:' error reply is raised as
        is, a failed connection is RedisUnavailable.
        """
        if self.lane is None and not self.replica_wait.count:
            return await self.run(call)
        try:
            [reply] = await run_pipeline(
                self.client, [call], replicas=self._replicas(), lane=self.lane
            )
        except RedisUnavailable as exc:
            cause = exc.__cause__
            if isinstance(cause, ResponseError) and "timewheel:" in str(cause):
                raise cause from None
            raise
        return call.decode(reply)

    async def write_many(self, calls: Sequence[Call[R]]) -> list[R]:
        """Many client changes in one pipeline, then the replica wait, decoded in order."""
        replies = await run_pipeline(self.client, calls, replicas=self._replicas(), lane=self.lane)
        return [c.decode(r) for c, r in zip(calls, replies, strict=True)]

    async def send(self, calls: Sequence[Call[Any]]) -> list[Any]:
        """Many calls in one pipeline (one per node on Cluster); the replies undecoded,
        for a caller that decodes each on its own (a fenced-out shard among many)."""
        return await run_pipeline(self.client, calls, lane=self.lane)

    async def run_many(self, calls: Sequence[Call[R]]) -> list[R]:
        """Many calls in one pipeline, decoded in order."""
        replies = await run_pipeline(self.client, calls, lane=self.lane)
        return [c.decode(r) for c, r in zip(calls, replies, strict=True)]

    @property
    def replicas_ack(self) -> int:
        """Replicas a write waits for where its primary has them (0: no wait)."""
        return self.replica_wait.count

    def _replicas(self) -> ReplicaWait | None:
        return self.replica_wait if self.replica_wait.count else None
