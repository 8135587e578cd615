"""Start and stop a local PostgreSQL server that keeps its data (`timewheel dev`).

The server binaries are Debian's, in /usr/lib/postgresql/<version>/bin (.ci/bootstrap
installs them; the newest version found is used). Everything lives in one folder:

    <root>/data          the cluster (initdb at the first start)
    <root>/postgres.log  the server's log
    <root>/port          the loopback port, kept so the DSN stays the same

PostgreSQL refuses to run as root. Run as root, the folder is given to the `postgres`
OS user (the Debian package creates it) and every server command runs through
`runuser -u postgres`; that user must be able to reach the folder, so its parents need
the x bit for others (a folder under /root usually does not: pick another data folder).

The server listens on 127.0.0.1 only, without a Unix socket, and trusts every local
connection: a development server. It is started in a session of its own, so a Ctrl-C
in the terminal reaches the caller, which then stops it with a fast shutdown.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
from pathlib import Path

import psycopg

from timewheel.errors import ConfigError
from timewheel.store.server import find_free_port

SUPERUSER = "timewheel"
"""The role initdb creates; the DSN connects as it."""
DATABASE = "timewheel"
OS_USER_AS_ROOT = "postgres"
_START_TIMEOUT_S = 60
_LOG_TAIL_CHARS = 2000


def _port_free(host: str, port: int) -> bool:
    """Whether `port` can be listened on, as PostgreSQL does (SO_REUSEADDR: connections
    of the previous server still in TIME_WAIT do not hold the port)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def postgres_bin_dir() -> Path:
    """The newest /usr/lib/postgresql/*/bin holding initdb.

    Raises:
        ConfigError: no PostgreSQL server binaries are installed.
    """
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parent.parent.name),
    )
    if not found:
        raise ConfigError(
            "PostgreSQL server binaries not found in /usr/lib/postgresql/*/bin: run "
            ".ci/bootstrap (Debian: apt-get install postgresql), or pass --no-postgres"
        )
    return Path(found[-1]).parent


class LocalPostgres:
    """One postgres server with its cluster, log and port in `root`.

    Restarting (after `stop()`, or in another process) reuses the cluster, the database
    and, when it is still free, the port.
    """

    def __init__(self, root: Path, *, host: str = "127.0.0.1") -> None:
        self.root = root
        self.host = host
        self.port = 0
        self._as_root = os.geteuid() == 0
        self._bin: Path | None = None

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def log_path(self) -> Path:
        return self.root / "postgres.log"

    @property
    def port_path(self) -> Path:
        return self.root / "port"

    def dsn(self, database: str = DATABASE) -> str:
        """postgresql://timewheel@127.0.0.1:<port>/<database>"""
        return f"postgresql://{SUPERUSER}@{self.host}:{self.port}/{database}"

    def _run(self, *command: str) -> subprocess.CompletedProcess[str]:
        argv = list(command)
        if self._as_root:
            argv = ["runuser", "-u", OS_USER_AS_ROOT, "--", *argv]
        # A session of its own: pg_ctl's postmaster stays in it, out of the reach of
        # the terminal's Ctrl-C.
        return subprocess.run(
            argv,
            check=False,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def _tool(self, name: str) -> str:
        if self._bin is None:
            self._bin = postgres_bin_dir()
        return str(self._bin / name)

    def _prepare_root(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if not self._as_root:
            os.chmod(self.root, 0o700)
            return
        if shutil.which("runuser") is None:
            raise ConfigError("running as root, PostgreSQL needs runuser (util-linux)")
        try:
            pwd.getpwnam(OS_USER_AS_ROOT)
        except KeyError:
            raise ConfigError(
                f"running as root, PostgreSQL runs as the OS user {OS_USER_AS_ROOT!r}, "
                "which does not exist (Debian's postgresql package creates it)"
            ) from None
        shutil.chown(self.root, OS_USER_AS_ROOT, OS_USER_AS_ROOT)
        os.chmod(self.root, 0o700)
        if self._run("test", "-w", str(self.root)).returncode:
            raise ConfigError(
                f"the OS user {OS_USER_AS_ROOT!r} cannot reach {self.root}: give its parent "
                "folders the x bit for others, pick a --data-dir it can reach, or pass "
                "--no-postgres"
            )

    def _choose_port(self) -> int:
        try:
            kept = int(self.port_path.read_text(encoding="utf-8").strip())
        except (FileNotFoundError, ValueError):
            kept = 0
        if kept and _port_free(self.host, kept):
            return kept
        return find_free_port(self.host)

    def _failed(self, what: str, done: subprocess.CompletedProcess[str]) -> ConfigError:
        try:
            log = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            log = ""
        return ConfigError(
            f"PostgreSQL {what} failed (exit {done.returncode}): {done.stdout}{done.stderr}"
            f"tail of {self.log_path}:\n{log[-_LOG_TAIL_CHARS:]}"
        )

    def is_running(self) -> bool:
        """True while a postmaster runs on the cluster (ours, or one left behind)."""
        if not (self.data / "postmaster.pid").exists():
            return False
        return self._run(self._tool("pg_ctl"), "-D", str(self.data), "status").returncode == 0

    def start(self) -> None:
        """initdb at the first start, start the server, create the database if missing.

        A server left running on the cluster (its owner was killed) is stopped first, so
        this one starts with the current port and options.

        Raises:
            ConfigError: binaries or user missing, or a command failed (the message holds
                the tail of the log).
        """
        self._prepare_root()
        if not (self.data / "PG_VERSION").exists():
            done = self._run(
                self._tool("initdb"),
                "-D",
                str(self.data),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
            )
            if done.returncode:
                raise self._failed("initdb", done)
        if self.is_running():
            self._stop("fast")
        self.port = self._choose_port()
        self.port_path.write_text(f"{self.port}\n", encoding="utf-8")
        options = (
            f"-p {self.port} -c listen_addresses={self.host} -c unix_socket_directories='' "
            "-c max_connections=50 -c shared_buffers=32MB"
        )
        done = self._run(
            self._tool("pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.log_path),
            "-o",
            options,
            "-w",
            "-t",
            str(_START_TIMEOUT_S),
            "start",
        )
        if done.returncode:
            raise self._failed("start", done)
        self._create_database()

    def _create_database(self) -> None:
        try:
            with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
                found = conn.execute(
                    "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)
                ).fetchone()
                if found is None:
                    conn.execute(f"CREATE DATABASE {DATABASE}")
        except psycopg.Error as exc:
            raise ConfigError(f"cannot create database {DATABASE!r}: {exc}") from exc

    def _stop(self, mode: str) -> subprocess.CompletedProcess[str]:
        return self._run(self._tool("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def stop(self) -> None:
        """Fast shutdown (open sessions are ended, everything committed is kept); an
        immediate one if that fails. Does nothing when no server runs."""
        if not self.is_running():
            return
        if self._stop("fast").returncode:
            self._stop("immediate")
