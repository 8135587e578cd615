"""A local Redis Cluster of redis-server processes (3 primaries at least, optional
replicas), for the tests and benches that run against a Cluster."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

import redis

from timewheel.errors import ConfigError
from timewheel.store.server import RedisServer, find_binary, ping_client

CLUSTER_SLOTS = 16384


def redis_cli_binary() -> str:
    """Return the path of the redis-cli binary (`--cluster create` needs it).

    Raises:
        ConfigError: redis-cli is neither on PATH nor in /usr/bin or /usr/local/bin.
    """
    return find_binary(
        "redis-cli",
        "redis-cli not found on PATH; install it (Debian: apt-get install redis-server)",
    )


class RedisClusterServers:
    """A local Redis Cluster: `primaries` primaries with `replicas_per_primary` replicas each."""

    def __init__(
        self,
        data_dir: Path,
        *,
        primaries: int = 3,
        replicas_per_primary: int = 0,
        appendfsync: str = "always",
        extra_config: Mapping[str, str] | None = None,
    ) -> None:
        """Describe the cluster; nothing runs until `start()`.

        Args:
            data_dir: Parent directory; node i lives in data_dir/node-<i>.
            primaries: Number of primaries (redis-cli needs at least 3).
            replicas_per_primary: Replicas per primary.
            appendfsync: Passed to every node.
            extra_config: More redis.conf settings for every node (e.g. a shorter
                cluster-node-timeout for failover tests).
        """
        if primaries < 3:
            raise ConfigError(f"primaries={primaries}: Redis Cluster needs at least 3")
        self.data_dir = data_dir
        self.primaries = primaries
        self.replicas_per_primary = replicas_per_primary
        nodes = primaries * (1 + replicas_per_primary)
        # Replicas sync at once instead of after the default 5 s wait for more replicas.
        fast_sync = {"repl-diskless-sync-delay": "0", **(extra_config or {})}
        self.servers: list[RedisServer] = [
            RedisServer(
                data_dir / f"node-{i}",
                appendfsync=appendfsync,
                cluster=True,
                extra_config=fast_sync,
            )
            for i in range(nodes)
        ]
        self._created = False

    @property
    def url(self) -> str:
        """URL of the first primary (a cluster client discovers the rest)."""
        return self.servers[0].url

    def start(self, timeout_s: float = 30.0) -> None:
        """Start every node, create the cluster and wait until all slots are served
        (and every replica is attached and linked to its primary).

        After `stop()`, starting again restarts the nodes on their ports, and they
        rejoin from their nodes.conf (no second `--cluster create`).

        Raises:
            ConfigError: A binary is missing, a node failed to start, `redis-cli
                --cluster create` failed, or the cluster was not ready in time.
        """
        deadline = time.monotonic() + timeout_s
        cli = redis_cli_binary()
        try:
            for server in self.servers:
                server.start(timeout_s=max(deadline - time.monotonic(), 1.0))
            if not self._created:
                self._create(cli, deadline)
                self._created = True
            self._wait_ready(deadline, timeout_s)
        except BaseException:
            self.stop()
            raise

    def _create(self, cli: str, deadline: float) -> None:
        addresses = [f"{s.host}:{s.port}" for s in self.servers]
        args = [cli, "--cluster", "create", *addresses]
        args += ["--cluster-replicas", str(self.replicas_per_primary), "--cluster-yes"]
        try:
            result = subprocess.run(
                args,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=max(deadline - time.monotonic(), 1.0),
                check=False,
            )
        except subprocess.TimeoutExpired as e:
            raise ConfigError(f"{' '.join(args)} timed out") from e
        if result.returncode != 0:
            raise ConfigError(
                f"{' '.join(args)} exited with code {result.returncode}:\n"
                f"{result.stdout}{result.stderr}"
            )

    def _wait_ready(self, deadline: float, timeout_s: float) -> None:
        pending = list(self.servers)
        while True:
            pending = [s for s in pending if not _node_ready(s, self.replicas_per_primary)]
            if not pending:
                return
            if time.monotonic() >= deadline:
                names = ", ".join(f"{s.host}:{s.port}" for s in pending)
                raise ConfigError(f"Redis Cluster not ready within {timeout_s}s: {names}")
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop every node (idempotent)."""
        for server in self.servers:
            server.stop()

    def __enter__(self) -> RedisClusterServers:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _node_ready(server: RedisServer, replicas: int) -> bool:
    """True when the node reports cluster_state:ok, its CLUSTER SLOTS cover every slot, and
    replication is up: a primary has `replicas` replicas online, a replica's link is up.

    Whether every node's CLUSTER SLOTS already lists the replicas is left to gossip (it
    can lag by seconds); clients that read from replicas should refresh their topology.
    """
    client = ping_client(server.host, server.port)
    try:
        # redis-py parses CLUSTER INFO and INFO into dicts; CLUSTER SLOTS stays a raw list
        # of [start, end, primary, replica, ...].
        info = client.cluster("INFO")
        if not isinstance(info, dict) or info.get("cluster_state") != "ok":
            return False
        slots = client.cluster("SLOTS")
        replication = client.info("replication")
    except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
        return False
    finally:
        client.close()
    if replication.get("role") == "slave":
        if replication.get("master_link_status") != "up":
            return False
    elif int(replication.get("connected_slaves", 0)) < replicas:
        return False
    covered: set[int] = set()
    for entry in slots:
        covered.update(range(int(entry[0]), int(entry[1]) + 1))
    return len(covered) == CLUSTER_SLOTS
