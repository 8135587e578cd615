"""The engine: every task operation, each one Lua call on one shard.

Where a task goes: `create` puts it in its shard's wheel (near level or a far bucket,
lua/task_create.lua); `promote` moves far buckets nearer (lua/dispatch_promote.lua);
`tick` moves due runs into ready streams (lua/dispatch_tick.lua);
`cancel` and `update` change them while still
scheduled; `reap` fails runs whose executor lease expired (lua/dispatch_reap.lua). The executor
side, `ack` and `fail`, is in timewheel/outcomes.py. Python only reads (`get`).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from timewheel import ids
from timewheel.config import Settings
from timewheel.dispatch.rates import DispatchRates
from timewheel.errors import (
    ConfigError,
    LeaseLost,
    PayloadTooLarge,
    RedisUnavailable,
    ScriptError,
    TaskNotFound,
    ValidationError,
)
from timewheel.models import (
    LAG_BUCKETS_MS,
    CreateResult,
    JSONValue,
    PromoteResult,
    Task,
    TickResult,
)
from timewheel.runs.outcomes import OutcomeOps
from timewheel.schedules.ops import ScheduleOps
from timewheel.store import record
from timewheel.store.connection import RedisClient, connect
from timewheel.store.keys import Keys
from timewheel.store.library import Script, ScriptArg, Scripts, check
from timewheel.store.pipeline import ScriptCall, run_pipeline
from timewheel.tasks import window as spread

NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def validate_name(value: object, field_name: str) -> str:
    """A tenant or queue name: 1-64 of letters, digits, '_', '.', '-' (they go into keys)."""
    if not isinstance(value, str) or not NAME.match(value):
        raise ValidationError(
            f"{field_name} must be 1-64 characters of A-Z a-z 0-9 _ . - (got {value!r})",
            field=field_name,
        )
    return value


CREATE_CHUNK = 200
"""Most tasks one task_create.lua call carries (keeps a call near a few ms)."""

_LAG_BOUNDS = ",".join(str(b) for b in LAG_BUCKETS_MS)
"""dispatch_tick.lua's ARGV[8]: the lag histogram's bounds, counted inside the call."""


@dataclass(frozen=True, slots=True)
class PreparedCreate:
    """A validated create: its id, shard and the 8 values task_create.lua takes for it."""

    task_id: str
    shard: int
    group: list[ScriptArg]


@dataclass(frozen=True, slots=True)
class NewTask:
    """A create request, already validated at the edge (times in epoch ms)."""

    tenant: str
    payload_json: str = "null"
    queue: str = "default"
    run_at_ms: int | None = None
    delay_ms: int | None = None
    idempotency_key: str | None = None
    options: Mapping[str, JSONValue] = field(default_factory=dict)


def _opt_int(value: Any) -> int | None:
    return None if value is None or int(value) < 0 else int(value)


def _tenant_counts(flat: list[Any]) -> dict[str, int]:
    """A Lua reply list {tenant, count, ...} as a dict."""
    return {flat[i].decode(): int(flat[i + 1]) for i in range(0, len(flat), 2)}


class Engine(OutcomeOps, ScheduleOps):
    """Task operations against one deployment's Redis (standalone or Cluster)."""

    def __init__(self, client: RedisClient, settings: Settings, scripts: Scripts | None = None):
        self.client = client
        self.settings = settings
        self.keys = Keys(settings.prefix)
        self.scripts = scripts or Scripts()
        self.is_cluster = isinstance(client, RedisCluster)
        self.replicas_ack = max(settings.min_replicas_ack, 0)
        """Replicas a create, cancel or reschedule waits for (WAIT) before it answers."""

    @classmethod
    async def connect(cls, settings: Settings) -> Engine:
        """Connect, check the deployment layout, and return an engine."""
        engine = cls(await connect(settings.redis_url), settings)
        try:
            await engine.ensure_layout()
            if settings.min_replicas_ack < 0:
                engine.replicas_ack = min(1, await engine.fewest_replicas())
        except BaseException:
            await engine.close()
            raise
        return engine

    async def close(self) -> None:
        await self.client.aclose()

    async def ensure_layout(self) -> None:
        """Record shards and bucket_ms on first use; refuse settings that disagree later.

        Raises:
            ConfigError: the deployment was created with another shard count or bucket width.
        """
        key = self.keys.layout()
        try:
            await self.client.hsetnx(key, "shards", self.settings.shards)
            await self.client.hsetnx(key, "bucket_ms", self.settings.bucket_ms)
            stored = await self.client.hgetall(key)
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"cannot read layout key {key!r}: {exc}") from exc
        for name in ("shards", "bucket_ms"):
            have = int(stored[name.encode()])
            if have != getattr(self.settings, name):
                raise ConfigError(
                    f"Setting {name!r} is {getattr(self.settings, name)} but the deployment "
                    f"under prefix {self.settings.prefix!r} was created with {have}."
                )

    async def check_durability(self) -> None:
        """Refuse a Redis whose settings break the promise that an acknowledged create is
        never lost: AOF off (a restart loses everything since the last RDB save), or a
        maxmemory-policy other than noeviction (Redis would evict tasks under pressure).
        Every primary of a Cluster is checked.

        Raises:
            ConfigError: a setting breaks the promise, or CONFIG GET is not allowed here.
        """
        client = self.client
        nodes: list[Any] = client.get_primaries() if isinstance(client, RedisCluster) else [None]
        for node in nodes:
            where = f"{node.host}:{node.port}" if node is not None else self.settings.redis_url
            try:
                if node is None:
                    found = await client.config_get("appendonly")
                    found.update(await client.config_get("maxmemory-policy"))
                else:
                    found = await client.config_get("appendonly", target_nodes=node)
                    found.update(await client.config_get("maxmemory-policy", target_nodes=node))
            except (RedisError, OSError) as exc:
                raise ConfigError(
                    f"cannot read the durability settings of Redis at {where} ({exc}); "
                    "pass --unsafe-durability to run without checking"
                ) from exc
            values = {_text(k): _text(v) for k, v in found.items()}
            problems = []
            if values.get("appendonly") != "yes":
                problems.append(f"appendonly is {values.get('appendonly')!r} (need yes)")
            if values.get("maxmemory-policy") != "noeviction":
                problems.append(
                    f"maxmemory-policy is {values.get('maxmemory-policy')!r} (need noeviction)"
                )
            if problems:
                raise ConfigError(
                    f"Redis at {where} would lose acknowledged tasks: {'; '.join(problems)}. "
                    "Use deploy/redis.conf, or pass --unsafe-durability to run anyway."
                )

    async def fewest_replicas(self) -> int:
        """The fewest connected replicas of any primary (INFO replication)."""
        client = self.client
        nodes: list[Any] = client.get_primaries() if isinstance(client, RedisCluster) else [None]
        counts = []
        try:
            for node in nodes:
                if node is None:
                    info = await client.info("replication")
                else:
                    info = await client.info("replication", target_nodes=node)
                counts.append(int(info.get("connected_slaves", 0)))
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"cannot read INFO replication: {exc}") from exc
        return min(counts, default=0)

    async def write(self, script: Script, keys: Sequence[str], args: Sequence[ScriptArg]) -> Any:
        """A client's change (create, cancel, reschedule): one script call, answered only
        once `replicas_ack` replicas have it (DESIGN.md section 9)."""
        if not self.replicas_ack:
            return await self.call(script, keys, args)
        [reply] = await run_pipeline(
            self.client, [(script, list(keys), list(args))], replicas=self._replicas()
        )
        return reply

    def _replicas(self) -> tuple[int, int] | None:
        return (self.replicas_ack, self.settings.replica_wait_ms) if self.replicas_ack else None

    async def ping(self) -> bool:
        try:
            return bool(await self.client.ping())
        except (RedisError, OSError):
            return False

    def check_payload(self, payload_json: str) -> None:
        """Raise PayloadTooLarge if the encoded payload is over the configured limit."""
        size = len(payload_json.encode())
        if size > self.settings.max_payload_bytes:
            raise PayloadTooLarge(
                f"payload is {size} bytes; the limit is {self.settings.max_payload_bytes}",
                field="payload",
            )

    # -- placement -----------------------------------------------------------------

    def shards_of(self, tenant: str) -> list[int]:
        """The shards holding a tenant's tasks and ready streams."""
        return ids.tenant_shards(tenant, self.settings.default_spread, self.settings.shards)

    def dispatch_rates(self) -> DispatchRates:
        """The per-shard copies of tenants' dispatch rates that the tick enforces."""
        return DispatchRates(self.client, self.keys, self.settings.shards, self.shards_of)

    def _locate(self, task_id: str) -> int:
        shard = ids.shard_of(task_id)
        if shard is None or shard >= self.settings.shards:
            raise TaskNotFound(task_id)
        return shard

    async def call(self, script: Script, keys: Sequence[str], args: Sequence[ScriptArg]) -> Any:
        """Run one script, mapping connection failures to RedisUnavailable."""
        try:
            return await script(self.client, keys, args)
        except (RedisError, OSError) as exc:
            if "timewheel:" in str(exc):
                raise
            raise RedisUnavailable(f"{script.name} failed: {exc}") from exc

    # -- create ----------------------------------------------------------------------

    def _prepare(self, new: NewTask) -> PreparedCreate:
        validate_name(new.tenant, "tenant")
        validate_name(new.queue, "queue")
        self.check_payload(new.payload_json)
        if (new.run_at_ms is None) == (new.delay_ms is None):
            raise ValidationError("give exactly one of run_at or delay", field="run_at")
        if new.idempotency_key is not None:
            token = ids.idempotent_token(new.tenant, new.idempotency_key)
        else:
            token = ids.new_token()
        shard = ids.shard_for(new.tenant, token, self.settings.default_spread, self.settings.shards)
        task_id = ids.make_task_id(shard, token)
        offset = spread.offset_ms(token, spread.option_ms(new.options, "window_s"))
        group: list[ScriptArg] = [
            task_id,
            new.tenant,
            new.queue,
            "" if new.run_at_ms is None else new.run_at_ms + offset,
            0 if new.delay_ms is None else new.delay_ms + offset,
            new.payload_json,
            json.dumps(dict(new.options), separators=(",", ":")) if new.options else "",
            "1" if new.idempotency_key is not None else "0",
        ]
        return PreparedCreate(task_id, shard, group)

    def create_calls(
        self, prepared: Sequence[PreparedCreate], now_ms: int | None = None
    ) -> tuple[list[ScriptCall], list[list[int]]]:
        """The task_create.lua calls for `prepared`: one per shard and chunk of CREATE_CHUNK,
        and for each call the indexes (in `prepared`) of the tasks it carries."""
        by_shard: dict[int, list[int]] = {}
        for i, p in enumerate(prepared):
            by_shard.setdefault(p.shard, []).append(i)
        k, s = self.keys, self.settings
        calls: list[ScriptCall] = []
        members: list[list[int]] = []
        for shard, indexes in by_shard.items():
            head: list[ScriptArg] = [
                s.bucket_ms,
                _arg(now_ms),
                s.event_log_max,
                k.wake_channel(),
                shard,
            ]
            for low in range(0, len(indexes), CREATE_CHUNK):
                chunk = indexes[low : low + CREATE_CHUNK]
                args = head + [v for i in chunk for v in prepared[i].group]
                calls.append((self.scripts.task_create, [k.meta(shard), k.events(shard)], args))
                members.append(chunk)
        return calls, members

    def _created(self, task_id: str, reply: list[Any]) -> CreateResult:
        code = int(reply[0])
        if code == 1:
            due_ms, wake, created_ms = int(reply[1]), bool(int(reply[2])), int(reply[3])
            return CreateResult(None, task_id, True, due_ms, wake, created_ms)
        if code == 2:
            raise ScriptError(f"run id collision {task_id}")
        task = record.decode(task_id, reply[1])
        return CreateResult(task, task_id, False, task.due_ms)

    async def create(self, new: NewTask, *, now_ms: int | None = None) -> CreateResult:
        """Schedule a one-shot task; an existing idempotency key returns the existing task.

        Raises:
            ValidationError: a name or time is malformed.
            PayloadTooLarge: the payload is over the configured limit.
        """
        prepared = self._prepare(new)
        [call], _ = self.create_calls([prepared], now_ms)
        [reply] = await self.write(*call)
        return self._created(prepared.task_id, reply)

    async def create_many(self, batch: Sequence[NewTask]) -> list[CreateResult]:
        """Create many tasks: one task_create.lua call per shard (and chunk), all in one
        pipeline (on Cluster, one per node, sent concurrently)."""
        prepared = [self._prepare(new) for new in batch]
        calls, members = self.create_calls(prepared)
        replies = await run_pipeline(self.client, calls, replicas=self._replicas())
        out: list[CreateResult | None] = [None] * len(prepared)
        for chunk, reply in zip(members, replies, strict=True):
            for i, item in zip(chunk, reply, strict=True):
                out[i] = self._created(prepared[i].task_id, item)
        return [r for r in out if r is not None]

    async def _pipeline(self, calls: list[ScriptCall]) -> list[Any]:
        return await run_pipeline(self.client, calls)

    # -- read, cancel, update -------------------------------------------------------

    async def get(self, tenant: str, task_id: str) -> Task:
        """The task as stored. Another tenant's id is TaskNotFound, like an unknown one."""
        shard = self._locate(task_id)
        k = self.keys
        sid = task_id.split("@", 1)[0] if "@" in task_id else None
        try:
            # What record_sent (lua/lib/record.lua) reads, in the same round trip: the
            # keys share the shard's hash tag, so one node on Cluster too.
            pipe = self.client.pipeline(transaction=False)
            pipe.hget(k.body(shard, task_id), k.body_field(task_id))
            pipe.hget(k.meta(shard), "promoted_until")
            pipe.zscore(k.near(shard, tenant), task_id)
            pipe.hget(k.schedule(shard, sid or "-"), "held")
            raw, promoted, score, held = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"get failed: {exc}") from exc
        if not isinstance(raw, bytes):
            raise TaskNotFound(task_id)
        task = record.decode(task_id, raw)
        if task.tenant != tenant:
            raise TaskNotFound(task_id)
        if task.state == "scheduled" and record.is_sent(
            task_id, task.due_ms, promoted, score, held
        ):
            task = record.decode(task_id, raw, sent=True)
        return task

    async def sent_runs(self, shard: int, tasks: Sequence[Task]) -> set[str]:
        """The run ids of `tasks` (records read from `shard`) that say scheduled but were
        sent (lua/lib/record.lua, record_sent): one round trip."""
        waiting = [t for t in tasks if t.state == "scheduled"]
        if not waiting:
            return set()
        k = self.keys
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.hget(k.meta(shard), "promoted_until")
            for t in waiting:
                pipe.zscore(k.near(shard, t.tenant), t.run_id)
                # '-' names no schedule: a one-shot run is never held.
                pipe.hget(k.schedule(shard, t.schedule_id or "-"), "held")
            replies: list[Any] = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"cannot read the near level: {exc}") from exc
        promoted = replies[0]
        return {
            t.run_id
            for i, t in enumerate(waiting)
            if record.is_sent(t.run_id, t.due_ms, promoted, replies[1 + 2 * i], replies[2 + 2 * i])
        }

    async def cancel(self, tenant: str, task_id: str, *, now_ms: int | None = None) -> Task:
        """Cancel a scheduled task. Raises TaskNotFound, or InvalidState once dispatched."""
        shard = self._locate(task_id)
        k = self.keys
        reply = await self.write(
            self.scripts.task_cancel,
            [k.meta(shard), k.body(shard, task_id), k.events(shard)],
            [task_id, tenant, self.settings.bucket_ms, _arg(now_ms), self.settings.event_log_max],
        )
        check(reply, run_id=task_id, action="cancel")
        return record.decode(task_id, reply[1])

    async def update(
        self,
        tenant: str,
        task_id: str,
        *,
        run_at_ms: int | None = None,
        delay_ms: int | None = None,
        payload_json: str | None = None,
        now_ms: int | None = None,
    ) -> Task:
        """Reschedule and/or replace the payload of a scheduled task.

        Raises:
            TaskNotFound: unknown id or another tenant's.
            InvalidState: the task is no longer scheduled.
            PayloadTooLarge: the new payload is over the limit.
        """
        if payload_json is not None:
            self.check_payload(payload_json)
        shard = self._locate(task_id)
        k, s = self.keys, self.settings
        reply = await self.write(
            self.scripts.task_update,
            [k.meta(shard), k.body(shard, task_id), k.events(shard)],
            [
                task_id,
                tenant,
                _arg(run_at_ms),
                _arg(delay_ms),
                payload_json or "",
                s.bucket_ms,
                _arg(now_ms),
                s.event_log_max,
                k.wake_channel(),
                shard,
            ],
        )
        check(reply, run_id=task_id, action="reschedule")
        return record.decode(task_id, reply[1])

    # -- scheduler side -------------------------------------------------------------

    async def tick(
        self,
        shard: int,
        *,
        limit: int | None = None,
        now_ms: int | None = None,
        node: str = "",
        epoch: int | str = "",
    ) -> TickResult:
        """Dispatch up to `limit` due runs of one shard. Raises LeaseLost when fenced out."""
        reply = await self.call(*self._tick_call(shard, limit, now_ms, node, epoch))
        return self._ticked(shard, reply)

    async def tick_many(
        self, shards: Sequence[tuple[int, int | str]], *, node: str = ""
    ) -> list[TickResult | LeaseLost]:
        """Tick several shards, given as (shard, epoch), in one pipeline (one per node on
        Cluster). A shard whose lease is lost answers LeaseLost in its place."""
        replies = await self._pipeline(
            [self._tick_call(shard, None, None, node, epoch) for shard, epoch in shards]
        )
        out: list[TickResult | LeaseLost] = []
        for (shard, _), reply in zip(shards, replies, strict=True):
            try:
                out.append(self._ticked(shard, reply))
            except LeaseLost as lost:
                out.append(lost)
        return out

    def _tick_call(
        self, shard: int, limit: int | None, now_ms: int | None, node: str, epoch: int | str
    ) -> tuple[Script, list[str], list[ScriptArg]]:
        k, s = self.keys, self.settings
        return (
            self.scripts.dispatch_tick,
            [k.meta(shard), k.due(shard), k.events(shard)],
            [
                limit or s.tick_batch,
                _arg(now_ms),
                node,
                epoch,
                s.event_log_max,
                s.misfire_ms,
                s.bucket_ms,
                _LAG_BOUNDS,
            ],
        )

    def _ticked(self, shard: int, reply: list[Any]) -> TickResult:
        check(reply, action="tick", shard=shard)
        return TickResult(
            shard=shard,
            dispatched=int(reply[0]),
            next_due_ms=_opt_int(reply[1]),
            now_ms=int(reply[2]),
            clock_back_ms=int(reply[3]),
            next_bucket_ms=_opt_int(reply[4]),
            promoted_until_ms=int(reply[5]),
            consumed=int(reply[6]),
            per_tenant=_tenant_counts(reply[7]),
            lag_counts=[int(v) for v in reply[8]],
            backlog=int(reply[9]),
            lag_sum_ms=int(reply[10]),
            held=_tenant_counts(reply[11]),
        )

    async def promote(
        self,
        shard: int,
        *,
        limit: int | None = None,
        now_ms: int | None = None,
        node: str = "",
        epoch: int | str = "",
    ) -> PromoteResult:
        """Move far buckets that start within the horizon into the near level."""
        k, s = self.keys, self.settings
        reply = await self.call(
            self.scripts.dispatch_promote,
            [k.meta(shard), k.due(shard), k.wheel(shard)],
            [s.horizon_ms, s.bucket_ms, limit or s.promote_batch, _arg(now_ms), node, epoch],
        )
        check(reply, action="promote", shard=shard)
        return PromoteResult(
            shard=shard,
            moved=int(reply[0]),
            more=bool(int(reply[1])),
            promoted_until_ms=int(reply[2]),
            next_bucket_ms=_opt_int(reply[3]),
        )

    async def expire_finished(
        self, shard: int, *, limit: int = 2000, now_ms: int | None = None
    ) -> tuple[int, bool]:
        """Delete finished records past retention; returns (deleted, more)."""
        k, s = self.keys, self.settings
        reply = await self.call(
            self.scripts.dispatch_expire,
            [k.meta(shard), k.expiry(shard)],
            [s.retention_ms, s.bucket_ms, limit, _arg(now_ms)],
        )
        return int(reply[0]), bool(int(reply[1]))

    # -- scheduler side, continued --------------------------------------------------

    async def reap(
        self, shard: int, *, node: str = "", epoch: int | str = "", now_ms: int | None = None
    ) -> tuple[int, int]:
        """Expired executor leases in one shard become failed attempts: (retried, buried)."""
        k, s = self.keys, self.settings
        reply = await self.call(
            self.scripts.dispatch_reap,
            [k.meta(shard), k.groups(shard), k.events(shard)],
            [
                node,
                epoch,
                s.min_visibility_timeout_ms,
                s.visibility_timeout_ms,
                500,
                repr(random.random()),
                s.retry_defaults_json(),
                s.bucket_ms,
                _arg(now_ms),
                s.event_log_max,
            ],
        )
        check(reply, action="reap", shard=shard)
        return int(reply[0]), int(reply[1])


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _arg(value: int | None) -> ScriptArg:
    return "" if value is None else value
