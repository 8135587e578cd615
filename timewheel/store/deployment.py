"""What a deployment's Redis must be before timewheel writes to it: the fixed layout,
durable settings, and how many replicas a write can wait for."""

from __future__ import annotations

from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from timewheel.config import Settings
from timewheel.errors import ConfigError, RedisUnavailable
from timewheel.store.connection import RedisClient
from timewheel.store.keys import Keys
from timewheel.types import text


def _primaries(client: RedisClient) -> list[Any]:
    """Every primary of a Cluster, or [None] for the one standalone server."""
    return client.get_primaries() if isinstance(client, RedisCluster) else [None]


async def ensure_layout(client: RedisClient, settings: Settings, library: str) -> None:
    """Record shards and bucket_ms on first use; refuse settings that disagree later; and
    let the shards grow (body hashes that split, distant buckets) once no older release
    can write to them.

    Body hashes that split (store/bodies.py) and distant buckets (lua/lib/wheel.lua) are
    stored shapes older releases cannot read: their creates would write under the 1,024
    hashes of level 10 of a shard that has split, and their cancels would not find a run
    in a distant bucket. So a deployment's shards grow only once `tw:layout` says
    `bodies: split`:
    written by the process that creates the deployment, or by one that starts while no
    Function library but its own (`library`) is loaded, that is once the old versions
    are removed after a rolling upgrade (docs/operations/upgrading.md). Every process
    then marks every shard's meta (`grow`), which the library reads.

    Raises:
        ConfigError: the deployment was created with another shard count or bucket width.
    """
    key = Keys(settings.prefix).layout()
    try:
        if await client.hsetnx(key, "shards", settings.shards):
            await client.hset(key, "bodies", "split")
        await client.hsetnx(key, "bucket_ms", settings.bucket_ms)
        stored = await client.hgetall(key)
    except (RedisError, OSError) as exc:
        raise RedisUnavailable(f"cannot read layout key {key!r}: {exc}") from exc
    for name in ("shards", "bucket_ms"):
        have = int(stored[name.encode()])
        if have != getattr(settings, name):
            raise ConfigError(
                f"Setting {name!r} is {getattr(settings, name)} but the deployment "
                f"under prefix {settings.prefix!r} was created with {have}."
            )
    split = stored.get(b"bodies") == b"split"
    if not split and await _only_library(client, library):
        await client.hset(key, "bodies", "split")
        split = True
    if split:
        await _let_shards_grow(client, settings)


async def _only_library(client: RedisClient, library: str) -> bool:
    """Whether no timewheel Function library but `library` is loaded on any primary
    (False when FUNCTION LIST is not allowed: nothing tells)."""
    for node in _primaries(client):
        target = {} if node is None else {"target_nodes": node}
        try:
            found: Any = await client.execute_command(
                "FUNCTION", "LIST", "LIBRARYNAME", "timewheel_*", **target
            )
        except (RedisError, OSError):
            return False
        for entry in found:
            fields = (
                entry
                if isinstance(entry, dict)
                else dict(zip(entry[::2], entry[1::2], strict=False))
            )
            name = text(fields.get(b"library_name", fields.get("library_name", b"")))
            if name != library:
                return False
    return True


async def _let_shards_grow(client: RedisClient, settings: Settings) -> None:
    """Mark every shard's meta: its body hashes may split and its runs wait in distant
    buckets (lua/lib/bodies.lua, lua/lib/wheel.lua)."""
    keys = Keys(settings.prefix)
    try:
        # One HSET at a time, once per process start: a Cluster pipeline here left the
        # api's cluster client unable to find a Cluster rebuilt on the same ports later.
        for shard in range(settings.shards):
            await client.hset(keys.meta(shard), "grow", 1)
    except (RedisError, OSError) as exc:
        raise RedisUnavailable(f"cannot mark the shards' layout: {exc}") from exc


async def check_durability(client: RedisClient, settings: Settings) -> None:
    """Refuse a Redis whose settings break the promise that an acknowledged create is
    never lost: AOF off (a restart loses everything since the last RDB save), or a
    maxmemory-policy other than noeviction (Redis would evict tasks under pressure).
    Every primary of a Cluster is checked.

    Raises:
        ConfigError: a setting breaks the promise, or CONFIG GET is not allowed here.
    """
    for node in _primaries(client):
        where = f"{node.host}:{node.port}" if node is not None else settings.redis_url
        target = {} if node is None else {"target_nodes": node}
        try:
            found = await client.config_get("appendonly", **target)
            found.update(await client.config_get("maxmemory-policy", **target))
        except (RedisError, OSError) as exc:
            raise ConfigError(
                f"cannot read the durability settings of Redis at {where} ({exc}); "
                "pass --unsafe-durability to run without checking"
            ) from exc
        values = {text(k): text(v) for k, v in found.items()}
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


async def replica_counts(client: RedisClient) -> dict[str, int]:
    """The connected replicas of each primary (INFO replication), by node name ('' for
    the one standalone server)."""
    counts: dict[str, int] = {}
    try:
        for node in _primaries(client):
            target = {} if node is None else {"target_nodes": node}
            info = await client.info("replication", **target)
            counts["" if node is None else str(node.name)] = int(info.get("connected_slaves", 0))
    except (RedisError, OSError) as exc:
        raise RedisUnavailable(f"cannot read INFO replication: {exc}") from exc
    return counts


async def stored_layout(client: RedisClient, prefix: str) -> dict[str, int] | None:
    """The layout a deployment recorded (shards, bucket_ms), read without writing; None
    when no deployment uses this prefix here."""
    key = Keys(prefix).layout()
    try:
        stored = await client.hgetall(key)
    except (RedisError, OSError) as exc:
        raise RedisUnavailable(f"cannot read layout key {key!r}: {exc}") from exc
    layout = {text(k): int(v) for k, v in stored.items() if text(k) in ("shards", "bucket_ms")}
    return layout if len(layout) == 2 else None
