"""Redis Sentinel: the `redis+sentinel://` URL, and a client of the primary it names.

    redis+sentinel://[user:password@]host1:port1[,host2:port2,...]/<service>[?db=N&...]

The hosts are sentinels (port 26379 when left out); `service` is the name they monitor
the primary under. `user:password` (percent-encoded) log in to the primary; the query
takes `db` (0 unless set) and `sentinel_username`, `sentinel_password` for sentinels
that require their own login. The client asks the sentinels for the primary's address
whenever one of its connections (re)connects, so after a failover every new connection
goes to the promoted replica; a connection still open to a demoted primary is closed on
its first READONLY reply (redis-py's SentinelManagedConnection).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote

import redis.asyncio as aioredis
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool

from timewheel.errors import ConfigError

SCHEME = "redis+sentinel"
DEFAULT_PORT = 26379
SENTINEL_TIMEOUT_S = 2.0
"""Connect and reply timeout of a call to one sentinel: a sentinel that is down or cut
off is passed over for the next one within this time."""
QUERY_OPTIONS = ("db", "sentinel_username", "sentinel_password")


@dataclass(frozen=True, slots=True)
class SentinelTarget:
    """What a `redis+sentinel://` URL names."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    username: str | None = None
    password: str | None = None
    db: int = 0
    sentinel_username: str | None = None
    sentinel_password: str | None = None

    def describe(self) -> str:
        """The URL without its passwords (for messages and logs)."""
        hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.sentinels)
        return f"{SCHEME}://{hosts}/{self.service}"


def is_sentinel_url(url: str) -> bool:
    return url.startswith(f"{SCHEME}://")


def parse_sentinel_url(url: str) -> SentinelTarget:
    """The sentinels, service and logins of a `redis+sentinel://` URL.

    Raises:
        ConfigError: not such a URL, no host, a bad port, no service name, a bad db or
            an unknown query option.
    """
    if not is_sentinel_url(url):
        raise ConfigError(f"Redis URL {url!r} does not start with {SCHEME}://")
    rest = url[len(SCHEME) + 3 :]
    rest, _, query = rest.partition("?")
    rest, _, fragment = rest.partition("#")
    if fragment:
        raise ConfigError(f"Sentinel URL {_redact(url)!r}: a fragment (#...) means nothing here")
    netloc, slash, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    sentinels = tuple(_host_port(url, part) for part in hosts.split(",") if part.strip())
    if not sentinels:
        raise ConfigError(
            f"Sentinel URL {_redact(url)!r} names no sentinel: "
            f"{SCHEME}://host1:port1[,host2:port2,...]/<service>"
        )
    service = unquote(path.strip("/")) if slash else ""
    if not service or "/" in service:
        raise ConfigError(
            f"Sentinel URL {_redact(url)!r} names no service: put the name the sentinels "
            f"monitor the primary under after the hosts ({SCHEME}://host:26379/<service>)"
        )
    options = _query(url, query)
    return SentinelTarget(
        sentinels=sentinels,
        service=service,
        username=username,
        password=password,
        db=_db(url, options.get("db", "0")),
        sentinel_username=options.get("sentinel_username") or None,
        sentinel_password=options.get("sentinel_password") or None,
    )


def _redact(url: str) -> str:
    """The URL with the password of its userinfo (if any) replaced by ***."""
    head, sep, tail = url.partition("://")
    netloc, slash, rest = tail.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if at and ":" in userinfo:
        userinfo = userinfo.split(":", 1)[0] + ":***"
    redacted = f"{userinfo}{at}{hosts}{slash}{rest}"
    # The query may hold sentinel_password=...
    if "sentinel_password=" in redacted:
        base, _, query = redacted.partition("?")
        pairs = [
            f"{k}=***" if k == "sentinel_password" else f"{k}={v}"
            for k, v in parse_qsl(query, keep_blank_values=True)
        ]
        redacted = f"{base}?{'&'.join(pairs)}"
    return f"{head}{sep}{redacted}"


def _host_port(url: str, part: str) -> tuple[str, int]:
    part = part.strip()
    if part.startswith("["):  # [IPv6]:port
        host, close, tail = part[1:].partition("]")
        if not close or (tail and not tail.startswith(":")):
            raise ConfigError(f"Sentinel URL {_redact(url)!r}: bad host {part!r}")
        port_text = tail[1:]
    else:
        host, _, port_text = part.partition(":")
        if ":" in port_text:
            raise ConfigError(
                f"Sentinel URL {_redact(url)!r}: bad host {part!r} (write IPv6 as [addr]:port)"
            )
    if not host:
        raise ConfigError(f"Sentinel URL {_redact(url)!r}: a sentinel without a host ({part!r})")
    if not port_text:
        return host, DEFAULT_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(
            f"Sentinel URL {_redact(url)!r}: bad port {port_text!r} of {host} (1-65535)"
        )
    return host, int(port_text)


def _query(url: str, query: str) -> dict[str, str]:
    options = dict(parse_qsl(query, keep_blank_values=True))
    unknown = sorted(set(options) - set(QUERY_OPTIONS))
    if unknown:
        raise ConfigError(
            f"Sentinel URL {_redact(url)!r}: unknown option(s) {', '.join(unknown)} "
            f"(known: {', '.join(QUERY_OPTIONS)})"
        )
    return options


def _db(url: str, text: str) -> int:
    if not text.isdigit():
        raise ConfigError(f"Sentinel URL {_redact(url)!r}: db={text!r} is not a number >= 0")
    return int(text)


class BlockingSentinelPool(SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """redis-py's Sentinel pool (each new connection asks the sentinels where the primary
    is) that, as the pool of a plain URL, makes a call wait for a free connection when
    all are busy instead of failing it."""


class SentinelPrimary(aioredis.Redis):
    """A client of the primary a Sentinel service names; closing it also closes its
    connections to the sentinels."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        manager = getattr(self.connection_pool, "sentinel_manager", None)
        if isinstance(manager, Sentinel):
            await manager.aclose()


def primary_client(
    target: SentinelTarget, *, connection_class: type[Any], **options: Any
) -> SentinelPrimary:
    """A client of `target`'s primary on a blocking Sentinel pool; `options` go to the
    pool (max_connections, timeout, socket_timeout ...)."""
    sentinel_options: dict[str, Any] = {
        "socket_timeout": SENTINEL_TIMEOUT_S,
        "socket_connect_timeout": SENTINEL_TIMEOUT_S,
    }
    if target.sentinel_username:
        sentinel_options["username"] = target.sentinel_username
    if target.sentinel_password:
        sentinel_options["password"] = target.sentinel_password
    # Sentinel() is typed from redis-py 8.2 on: the ignore is for 8.1.
    sentinel = Sentinel(  # type: ignore[no-untyped-call, unused-ignore]
        list(target.sentinels), sentinel_kwargs=sentinel_options
    )
    client = sentinel.master_for(
        target.service,
        redis_class=SentinelPrimary,
        connection_pool_class=BlockingSentinelPool,
        connection_class=connection_class,
        username=target.username,
        password=target.password,
        db=target.db,
        **options,
    )
    assert isinstance(client, SentinelPrimary)
    return client
