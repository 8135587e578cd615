"""Local Redis Sentinel deployments: sentinel processes (`redis-server <conf> --sentinel`)
monitoring a primary, and a primary with replicas and three sentinels, for the tests and
benches that kill a primary and expect a replica to take over."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

import redis

from timewheel.errors import ConfigError
from timewheel.store.server import RedisServer, ping_client, quote_config

SERVICE = "tw"


class SentinelServer(RedisServer):
    """One sentinel monitoring the primary at `primary` (host, port) as `service`.

    Small timings by default so a failover takes a few seconds: the primary is deemed
    down after `down_after_ms` without a reply, and a failover that stalls is tried
    again after `failover_timeout_ms`.
    """

    mode_args = ("--sentinel",)

    def __init__(
        self,
        data_dir: Path,
        primary: tuple[str, int],
        *,
        service: str = SERVICE,
        quorum: int = 2,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 5000,
        port: int = 0,
    ) -> None:
        super().__init__(data_dir, port=port)
        self.primary = primary
        self.service = service
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def config_lines(self) -> list[str]:
        host, port = self.primary
        name = self.service
        settings = {
            "port": str(self.port),
            "bind": self.host,
            "dir": str(self.data_dir),
            "logfile": str(self.log_path),
            "pidfile": "",
            "daemonize": "no",
            "protected-mode": "no",
        }
        lines = [f"{key} {quote_config(value)}" for key, value in settings.items()]
        return [
            *lines,
            f"sentinel monitor {name} {host} {port} {self.quorum}",
            f"sentinel down-after-milliseconds {name} {self.down_after_ms}",
            f"sentinel failover-timeout {name} {self.failover_timeout_ms}",
            f"sentinel parallel-syncs {name} 1",
        ]

    def client(self) -> redis.Redis:
        return ping_client(self.host, self.port)

    def primary_address(self) -> tuple[str, int] | None:
        """The primary this sentinel names now, or None if it cannot say."""
        client = self.client()
        try:
            reply = client.execute_command(  # type: ignore[no-untyped-call]
                "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service
            )
        except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
            return None
        finally:
            client.close()
        if not reply:
            return None
        host, port = reply
        return (host.decode() if isinstance(host, bytes) else str(host), int(port))


def sentinel_url(sentinels: list[SentinelServer], service: str = SERVICE) -> str:
    """The redis+sentinel:// URL of these sentinels' service."""
    return f"redis+sentinel://{','.join(s.address for s in sentinels)}/{service}"


def start_sentinels(
    root: Path,
    primary: tuple[str, int],
    *,
    count: int = 3,
    down_after_ms: int = 1000,
    failover_timeout_ms: int = 5000,
    timeout_s: float = 30.0,
) -> list[SentinelServer]:
    """Start `count` sentinels (root/sentinel-<i>) monitoring `primary`, and wait until
    each knows the others and the primary's replicas are known (bounded).

    Raises:
        ConfigError: a sentinel did not start, or they did not find each other in time.
    """
    sentinels = [
        SentinelServer(
            root / f"sentinel-{i}",
            primary,
            quorum=max(1, count // 2 + 1),
            down_after_ms=down_after_ms,
            failover_timeout_ms=failover_timeout_ms,
        )
        for i in range(count)
    ]
    try:
        for s in sentinels:
            s.start()
        wait_sentinels_ready(sentinels, timeout_s)
    except BaseException:
        for s in sentinels:
            s.kill()
        raise
    return sentinels


def wait_sentinels_ready(sentinels: list[SentinelServer], timeout_s: float) -> None:
    """Until every sentinel sees the others (SENTINEL MASTER's num-other-sentinels) and
    the primary's replicas (num-slaves, as INFO replication on the primary shows them).
    """
    primary = sentinels[0].primary
    deadline = time.monotonic() + timeout_s
    while True:
        replicas = _connected_replicas(primary)
        ready = replicas is not None and all(
            _sees(s, len(sentinels) - 1, replicas) for s in sentinels
        )
        if ready:
            return
        if time.monotonic() >= deadline:
            raise ConfigError(
                f"sentinels did not find each other and the {replicas} replica(s) of "
                f"{primary[0]}:{primary[1]} within {timeout_s:.0f} s"
            )
        time.sleep(0.1)


def _connected_replicas(primary: tuple[str, int]) -> int | None:
    client = ping_client(*primary)
    try:
        return int(client.info("replication").get("connected_slaves", 0))
    except (redis.ConnectionError, redis.TimeoutError):
        return None
    finally:
        client.close()


def _sees(sentinel: SentinelServer, others: int, replicas: int) -> bool:
    client = sentinel.client()
    try:
        raw = client.execute_command(  # type: ignore[no-untyped-call]
            "SENTINEL", "MASTER", sentinel.service
        )
    except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
        return False
    finally:
        client.close()
    fields = _pairs(raw)
    return (
        int(fields.get("num-other-sentinels", 0)) >= others
        and int(fields.get("num-slaves", 0)) >= replicas
    )


def _pairs(raw: object) -> dict[str, str]:
    """A flat [k, v, k, v ...] reply (or a mapping) as {str: str}."""

    def text(v: object) -> str:
        return v.decode() if isinstance(v, bytes) else str(v)

    if isinstance(raw, Mapping):
        return {text(k): text(v) for k, v in raw.items()}
    if isinstance(raw, list | tuple):
        return {text(raw[i]): text(raw[i + 1]) for i in range(0, len(raw) - 1, 2)}
    return {}


def replica_in_sync(replica: RedisServer, primary: RedisServer) -> bool:
    """Whether `replica`'s link to `primary` is up and it has every byte the primary
    has sent (its offset equals the primary's)."""
    r, p = ping_client(replica.host, replica.port), ping_client(primary.host, primary.port)
    try:
        info = r.info("replication")
        master = p.info("replication")
    except (redis.ConnectionError, redis.TimeoutError):
        return False
    finally:
        r.close()
        p.close()
    offset = int(info.get("slave_repl_offset", -1))
    return info.get("master_link_status") == "up" and offset == int(
        master.get("master_repl_offset", -2)
    )


class SentinelDeployment:
    """A primary, `replicas` replicas and three sentinels, every server on a free
    loopback port under `root`; `url` is its redis+sentinel:// URL."""

    def __init__(
        self,
        root: Path,
        *,
        replicas: int = 1,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 5000,
        extra_config: Mapping[str, str] | None = None,
    ) -> None:
        self.root = root
        self.extra_config = dict(extra_config or {})
        self.primary = RedisServer(root / "primary", extra_config=self.extra_config)
        self.replica_count = replicas
        self.replicas: list[RedisServer] = []
        self.sentinels: list[SentinelServer] = []
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms

    @property
    def url(self) -> str:
        return sentinel_url(self.sentinels)

    @property
    def servers(self) -> list[RedisServer]:
        return [self.primary, *self.replicas]

    def start(self, timeout_s: float = 30.0) -> None:
        self.primary.start()
        address = (self.primary.host, self.primary.port)
        for i in range(self.replica_count):
            config = {**self.extra_config, "replicaof": f"{address[0]} {address[1]}"}
            replica = RedisServer(self.root / f"replica-{i}", extra_config=config)
            self.replicas.append(replica)
            replica.start()
        deadline = time.monotonic() + timeout_s
        while not all(replica_in_sync(r, self.primary) for r in self.replicas):
            if time.monotonic() >= deadline:
                raise ConfigError(f"the replicas did not sync within {timeout_s:.0f} s")
            time.sleep(0.05)
        self.sentinels = start_sentinels(
            self.root,
            address,
            down_after_ms=self.down_after_ms,
            failover_timeout_ms=self.failover_timeout_ms,
            timeout_s=timeout_s,
        )

    def named_primary(self) -> tuple[str, int] | None:
        """The primary the sentinels agree on (a majority), or None."""
        named = [s.primary_address() for s in self.sentinels if s.is_running()]
        for address in named:
            if address is not None and named.count(address) * 2 > len(self.sentinels):
                return address
        return None

    def server_at(self, address: tuple[str, int]) -> RedisServer:
        return next(s for s in self.servers if (s.host, s.port) == address)

    def stop(self) -> None:
        for s in self.sentinels:
            s.kill()
        for server in reversed(self.servers):
            server.stop()

    def __enter__(self) -> SentinelDeployment:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
