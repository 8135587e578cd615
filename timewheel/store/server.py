"""Start and stop a local redis-server process (`timewheel dev`, tests and benches).

A 3-primary Cluster of such servers is timewheel.testing.redis_cluster."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from timewheel.errors import ConfigError

RECOMMENDED_CONFIG: dict[str, str] = {
    # An acknowledged create is fsynced to the AOF before Redis replies (docs/design.md,
    # durability).
    "appendonly": "yes",
    "appendfsync": "always",
    # Evicting a key is losing a task: fail writes instead when memory runs out.
    "maxmemory-policy": "noeviction",
    # Task bodies and time-bucket hashes stay listpack-encoded (~140 B/task, not ~190 B).
    "hash-max-listpack-entries": "1024",
    "hash-max-listpack-value": "1024",
    # Ready streams in nodes of 4 entries: deleting an acknowledged entry (XDEL) walks its
    # node, so an ack takes 12 % fewer instructions and a retry 8 % than with Redis' 100,
    # for about 190 B more a run while it waits in a stream (docs/operations/capacity.md).
    "stream-node-max-entries": "4",
    # AOF rewrites start with a compact RDB image, so restarts replay quickly.
    "aof-use-rdb-preamble": "yes",
    # A rewrite once the log since the last one reaches 7% of the image (and the AOF
    # 256 MB in all): a crash replays the image plus at most that much log, which
    # replays some 15 times slower per byte (docs/operations/capacity.md; at 50 M tasks
    # a 2.65 GiB image loads in 14 s and its 7%, 190 MB, in about 24 s).
    "auto-aof-rewrite-percentage": "7",
    "auto-aof-rewrite-min-size": "256mb",
    # No RDB snapshots: the AOF is the durability.
    "save": "",
}
"""Settings the shipped deploy/redis.conf also holds; every server started here uses them."""

_CLUSTER_BUS_OFFSET = 10000
_MAX_SOCKET_PATH = 107  # bytes of a Unix socket address's path (sun_path, 108 with its NUL)
_MAX_CLUSTER_PORT = 65535 - _CLUSTER_BUS_OFFSET
_POLL_INTERVAL_S = 0.02
_LOG_TAIL_LINES = 20


def redis_server_binary() -> str:
    """Return the path of the redis-server binary.

    Raises:
        ConfigError: redis-server is neither on PATH nor in /usr/bin or /usr/local/bin.
    """
    return find_binary(
        "redis-server",
        "redis-server not found on PATH; install it (Debian: apt-get install redis-server)",
    )


def find_binary(name: str, missing_message: str) -> str:
    """Return the path of a Redis binary on PATH or in /usr/bin or /usr/local/bin.

    Raises:
        ConfigError: with `missing_message`, when it is in none of them.
    """
    found = shutil.which(name)
    if found:
        return found
    for directory in ("/usr/bin", "/usr/local/bin"):
        candidate = Path(directory) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise ConfigError(missing_message)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _port_bindable(host: str, port: int) -> bool:
    with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def find_free_port(host: str = "127.0.0.1", *, cluster_bus: bool = False) -> int:
    """Return a TCP port on `host` that is free right now.

    The port is only probed, not held, so another process may take it before it is
    used; callers bind it straight away.

    Args:
        host: Address to probe.
        cluster_bus: Also require port + 10000 (the Redis Cluster bus port) to be free,
            which needs port <= 55535.

    Returns:
        The port number.

    Raises:
        ConfigError: No suitable port was found after many attempts.
    """
    for _ in range(200):
        with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port: int = sock.getsockname()[1]
        if not cluster_bus:
            return port
        if port <= _MAX_CLUSTER_PORT and _port_bindable(host, port + _CLUSTER_BUS_OFFSET):
            return port
    raise ConfigError(f"no free port on {host} (cluster_bus={cluster_bus})")


def quote_config(value: str) -> str:
    """Quote a redis.conf argument when it is empty or holds spaces/quotes."""
    if value and not any(c.isspace() or c in "\"'\\" for c in value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def ping_client(host: str, port: int) -> redis.Redis:
    """A client for polling a starting server: short timeouts, no retries."""
    # No retries: the callers poll, and redis-py's default backoff would slow that down.
    return redis.Redis(
        host=host,
        port=port,
        socket_timeout=2.0,
        socket_connect_timeout=1.0,
        retry=Retry(NoBackoff(), 0),
    )


class RedisServer:
    """One local redis-server process with its config, AOF and log in `data_dir`.

    Restarting after `stop()` or `kill()` reuses the same port and data_dir, so the
    AOF is replayed (crash tests).
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        appendfsync: str = "always",
        cluster: bool = False,
        extra_config: Mapping[str, str] | None = None,
        unix_socket: bool = False,
    ) -> None:
        """Describe a server; nothing runs until `start()`.

        Args:
            data_dir: Directory for redis.conf, redis.log, the AOF and nodes.conf.
            port: TCP port; 0 picks a free one at the first `start()`.
            host: Address to bind.
            appendfsync: "always", "everysec" or "no".
            cluster: Start with cluster-enabled yes.
            extra_config: Settings written after (and overriding) the defaults.
            unix_socket: Also listen on data_dir/redis.sock (owner only), when that path
                fits a Unix socket address (`socket_path`).
        """
        self.data_dir = data_dir
        self.port = port
        self.host = host
        self.appendfsync = appendfsync
        self.cluster = cluster
        self.extra_config: dict[str, str] = dict(extra_config or {})
        path = data_dir.resolve() / "redis.sock"
        self.socket_path: Path | None = (
            path if unix_socket and len(os.fsencode(path)) <= _MAX_SOCKET_PATH else None
        )
        """The Unix socket the server listens on too, or None (not asked for, or a path
        too long for a socket address)."""
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """redis://host:port (port is 0 until the first `start()` when it was 0)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"redis://{host}:{self.port}"

    @property
    def local_url(self) -> str:
        """unix://<socket> when the server listens on a Unix socket, else `url`: what a
        process on the same machine connects to (no TCP stack: some 15-20 us less CPU per
        round trip on the client's side, docs/operations/deployment.md)."""
        return f"unix://{self.socket_path}" if self.socket_path is not None else self.url

    @property
    def config_path(self) -> Path:
        """Path of the redis.conf written by `start()`."""
        return self.data_dir / "redis.conf"

    @property
    def log_path(self) -> Path:
        """Path of the server's log (its stdout and stderr go there too)."""
        return self.data_dir / "redis.log"

    def config(self) -> dict[str, str]:
        """Return the settings `start()` writes to redis.conf."""
        settings = dict(RECOMMENDED_CONFIG)
        settings.update(
            {
                "appendfsync": self.appendfsync,
                "port": str(self.port),
                "bind": self.host,
                "dir": str(self.data_dir),
                "logfile": str(self.log_path),
                "pidfile": "",  # empty means no pidfile (redis.conf has no "none")
                "daemonize": "no",
                "protected-mode": "no",
            }
        )
        if self.socket_path is not None:
            settings.update({"unixsocket": str(self.socket_path), "unixsocketperm": "700"})
        if self.cluster:
            settings.update(
                {
                    "cluster-enabled": "yes",
                    "cluster-config-file": "nodes.conf",
                    "cluster-node-timeout": "5000",
                }
            )
        settings.update(self.extra_config)
        return settings

    def config_lines(self) -> list[str]:
        """The lines of the redis.conf `start()` writes."""
        return [f"{key} {quote_config(value)}" for key, value in self.config().items()]

    mode_args: tuple[str, ...] = ()
    """Arguments after the config file on redis-server's command line (--sentinel)."""

    def start(self, timeout_s: float = 15.0) -> None:
        """Write redis.conf, spawn redis-server and wait until it answers PING.

        Does nothing if the server is already running.

        Args:
            timeout_s: How long to wait for PING (AOF replay included).

        Raises:
            ConfigError: redis-server is missing, exited, or did not answer in time;
                the message holds the tail of redis.log.
        """
        if self.is_running():
            return
        binary = redis_server_binary()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.port == 0:
            self.port = find_free_port(self.host, cluster_bus=self.cluster)
        self.config_path.write_text("\n".join(self.config_lines()) + "\n", encoding="utf-8")
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                [binary, str(self.config_path), *self.mode_args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,
            )
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.kill()
            raise

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        client = ping_client(self.host, self.port)
        try:
            while True:
                proc = self._proc
                if proc is None or proc.poll() is not None:
                    code = None if proc is None else proc.returncode
                    raise ConfigError(
                        f"redis-server on {self.host}:{self.port} exited with code {code}; "
                        f"tail of {self.log_path}:\n{self.log_tail()}"
                    )
                with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
                    # BusyLoadingError (AOF replay in progress) is a ConnectionError.
                    if client.ping():
                        return
                if time.monotonic() >= deadline:
                    raise ConfigError(
                        f"redis-server on {self.host}:{self.port} did not answer PING "
                        f"within {timeout_s}s; tail of {self.log_path}:\n{self.log_tail()}"
                    )
                time.sleep(_POLL_INTERVAL_S)
        finally:
            client.close()

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """Return the last `lines` lines of redis.log ("" if there is none)."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout_s: float = 10.0) -> None:
        """Shut down cleanly: SIGTERM (Redis fsyncs the AOF), then SIGKILL after timeout_s.

        Idempotent: does nothing if the server is not running.
        """
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self._kill_group(proc)
        proc.wait()
        self._proc = None

    def kill(self) -> None:
        """SIGKILL the server (and any AOF-rewrite child) and wait: a crash, for tests."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            self._kill_group(proc)
        proc.wait()
        self._proc = None

    @staticmethod
    def _kill_group(proc: subprocess.Popen[bytes]) -> None:
        # The server leads its own session (start_new_session=True), so its pid is the
        # group id; killing the group also takes a forked AOF-rewrite child. The process
        # is not reaped yet, so the id cannot have been reused.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    def is_running(self) -> bool:
        """Return True while the spawned redis-server process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
