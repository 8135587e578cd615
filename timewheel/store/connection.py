"""Connecting to Redis: one URL, standalone or Cluster (detected at connect time), or a
standalone primary found through Redis Sentinel (`redis+sentinel://`, store/sentinel.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeAlias
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import SentinelManagedConnection
from redis.exceptions import ConnectionError, ReadOnlyError, RedisClusterException, RedisError

from timewheel.errors import ConfigError, RedisUnavailable
from timewheel.store.sentinel import is_sentinel_url, parse_sentinel_url, primary_client

RedisClient: TypeAlias = "aioredis.Redis | RedisCluster"

SOCKET_TIMEOUT_S = 30.0
UNREACHABLE: tuple[type[Exception], ...] = (RedisError, OSError, RedisClusterException)
"""What a call to a server that is down, restarting or failing over raises. A Cluster
client whose every node refuses connections (the whole Cluster restarting) raises
RedisClusterException, which is no RedisError: a loop that rides out an outage catches
this tuple and tries again. A primary that Sentinel demoted answers writes READONLY
(ReadOnlyError, a RedisError): unreachable too, until the client finds the new primary."""

SCHEMES = ("redis://", "rediss://", "unix://", "redis+sentinel://")


UVLOOP_CLOSED = "handler is closed"
"""What uvloop's RuntimeError says of a write to a transport that a reset closed."""
TORN: tuple[type[Exception], ...] = (AttributeError, TypeError, RuntimeError)
"""What redis-py lets out, besides UNREACHABLE, when a server closes a connection under it
(torn_connection tells which of these it was)."""


def torn_connection(exc: BaseException) -> bool:
    """Whether an error of TORN was raised inside redis-py's or asyncio's connection code.

    A write on a connection the server closed while another task was using or resetting
    it (a server killed or restarting) raises AttributeError or TypeError in redis-py 8.1
    instead of ConnectionError; on uvloop a write to its closed transport raises
    RuntimeError ("... the handler is closed") from uvloop's own code, under redis-py's.
    `_Connection` maps the latter for the standalone pools; a Cluster's node connections
    are redis-py's own class, so a reset of a Cluster node reaches the caller as it is.
    Such an error means the server is unreachable, not a fault of the caller; anything
    raised elsewhere is left alone."""
    tb = exc.__traceback__
    if tb is None:
        return False
    paths = []
    while tb is not None:
        paths.append(tb.tb_frame.f_code.co_filename.replace("\\", "/"))
        tb = tb.tb_next
    if isinstance(exc, RuntimeError):
        return UVLOOP_CLOSED in str(exc) and any(
            "/redis/" in path or "/asyncio/" in path for path in paths
        )
    return "/redis/" in paths[-1] or "/asyncio/" in paths[-1]


"""A pass's pipeline can hold seconds of Lua work after downtime (and an fsync stall on
top): redis-py's 5 s default would time out a call that is in fact running."""


class _Connection(aioredis.Connection):
    """redis-py's TCP connection, with one more way of finding the socket gone mapped to
    ConnectionError.

    On uvloop (the API runs on it) writing to a transport that a reset has closed raises
    RuntimeError ("unable to perform operation on <TCPTransport closed=True ...>; the
    handler is closed"). redis-py maps only OSError to ConnectionError, so a request that
    met a connection reset by a dying redis-server was answered 500, not 503.
    """

    async def send_packed_command(
        self, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        try:
            await super().send_packed_command(command, check_health)
        except RuntimeError as exc:  # super() has disconnected already
            if UVLOOP_CLOSED not in str(exc):
                raise
            where = f"{self.host}:{self.port}"
            raise ConnectionError(f"Error while writing to {where}: {exc}") from exc


class _SentinelConnection(SentinelManagedConnection, _Connection):
    """A connection of a Sentinel pool (it asks the sentinels for the primary's address
    when it connects, and closes itself on a READONLY reply of a demoted primary), with
    `_Connection`'s mapping of a closed uvloop transport.

    A send on a closed connection connects it first through `connect`, which asks the
    sentinels: redis-py 8.1's send_packed_command reconnects to the address the
    connection last had (the demoted primary, after a failover) instead. Connections
    kept out of the pool between calls (a worker's wire) reconnect that way.
    """

    async def send_packed_command(
        self, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        if not self.is_connected:
            await self.connect()  # type: ignore[no-untyped-call]
        await super().send_packed_command(command, check_health)


def demoted(replies: Iterable[object]) -> bool:
    """Whether any reply is READONLY: the server is a replica now (Sentinel demoted the
    primary). A connection that reads replies past redis-py's read_response (the packed
    pipelines) closes itself then, so that it connects again to the primary Sentinel
    names, as a SentinelManagedConnection does on its own reads."""
    # A loop, not any() over a generator: this runs on every lane exchange.
    for reply in replies:  # noqa: SIM110
        if isinstance(reply, ReadOnlyError):
            return True
    return False


class FcallRoutingCluster(RedisCluster):
    """RedisCluster that routes FCALL by its first key, as redis-py already does for
    EVALSHA: redis-py otherwise asks the server (COMMAND GETKEYS) on every call, a round
    trip more than the call itself. Every key of one of our calls shares a hash tag."""

    async def _determine_slot(self, command: str, *args: Any) -> int:
        if command.upper() in ("FCALL", "FCALL_RO") and len(args) >= 3 and int(args[1]) > 0:
            return int(self.keyslot(args[2]))
        return int(await super()._determine_slot(command, *args))


def _pool_options(url: str) -> dict[str, Any]:
    """Pool options: our connection class (above); and redis-py's maintenance notifications
    off. With them on ("auto", the default over RESP3 in recent redis-py, 8.1 here) its
    pool skips the check that a pooled connection is still open before handing it out
    (ConnectionPool.ensure_connection), so after a restart of redis-server the first
    command on each connection from before failed with "Connection closed by server" (an
    API request answered 503 although Redis was up again). They serve managed endpoints
    that move during maintenance.
    """
    options: dict[str, Any] = {}
    if url.startswith("redis://"):  # rediss:// and unix:// keep their own classes
        options["connection_class"] = _Connection
    try:
        from redis.maint_notifications import MaintNotificationsConfig
    except ImportError:  # pragma: no cover - an older redis-py always checks
        return options
    options["maint_notifications_config"] = MaintNotificationsConfig(enabled=False)
    return options


async def connect(url: str, *, max_connections: int = 64) -> RedisClient:
    """A client for `url`; a node with cluster mode enabled gets a cluster client.

    Raises:
        ConfigError: the URL is malformed.
        RedisUnavailable: nothing answers at the URL.
    """
    if not url.startswith(SCHEMES):
        raise ConfigError(
            f"Redis URL {url!r} must start with redis://, rediss://, unix:// or redis+sentinel://"
        )
    if is_sentinel_url(url):
        return await _connect_sentinel(url, max_connections)
    probe = aioredis.Redis.from_url(url, socket_connect_timeout=5)
    try:
        info = await probe.info("cluster")
    except (RedisError, OSError) as exc:
        raise RedisUnavailable(f"cannot reach Redis at {url}: {exc}") from exc
    finally:
        await probe.aclose()
    if info.get("cluster_enabled"):
        # Built from parts: RedisCluster.from_url leaves node connections open on close.
        parts = urlsplit(url)
        cluster = FcallRoutingCluster(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 6379,
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
            ssl=parts.scheme == "rediss",
            max_connections=max_connections * 4,  # per node
            socket_timeout=SOCKET_TIMEOUT_S,
        )
        await cluster.initialize()
        return cluster
    # A blocking pool: more concurrent calls than connections wait for one, not fail.
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=30,
        socket_timeout=SOCKET_TIMEOUT_S,
        **_pool_options(url),
    )
    return aioredis.Redis.from_pool(pool)  # owns the pool: aclose() closes its sockets


async def _connect_sentinel(url: str, max_connections: int) -> aioredis.Redis:
    """A client of the primary a Sentinel service names (standalone: no Cluster detection),
    checked with a PING."""
    target = parse_sentinel_url(url)
    client = sentinel_client(url, max_connections=max_connections)
    try:
        await client.ping()
    except (RedisError, OSError) as exc:
        await client.aclose()
        raise RedisUnavailable(f"cannot reach the primary of {target.describe()}: {exc}") from exc
    return client


def sentinel_client(url: str, *, max_connections: int = 64) -> aioredis.Redis:
    """A client of the primary of a `redis+sentinel://` URL, on a blocking pool of our
    connection class (nothing is connected yet).

    Raises:
        ConfigError: the URL is malformed.
    """
    return primary_client(
        parse_sentinel_url(url),
        connection_class=_SentinelConnection,
        max_connections=max_connections,
        timeout=30,
        socket_timeout=SOCKET_TIMEOUT_S,
        socket_connect_timeout=5,
        **_pool_options(url),
    )


def node_client(url: str) -> aioredis.Redis:
    """A plain client of one node: the URL's server (a Cluster's node given), or the
    primary a Sentinel URL names (for pub/sub: PUBLISH reaches every node of a Cluster)."""
    if is_sentinel_url(url):
        return sentinel_client(url, max_connections=4)
    return aioredis.Redis.from_url(url)
