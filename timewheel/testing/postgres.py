"""A throwaway PostgreSQL server for tests and benches: initdb + pg_ctl on a free
loopback port.

The server binaries come from /usr/lib/postgresql/<version>/bin (Debian's layout;
.ci/bootstrap installs them). PostgreSQL refuses to run as root, so when the tests run
as root the data directory is given to the `postgres` OS user and every server command
runs through `runuser -u postgres`. Missing binaries or user raise RuntimeError: the
test that needs the server fails loudly. Each test gets a database of its own
(`create_database`, the plugin's `postgres_dsn` fixture), created from template0.
"""

from __future__ import annotations

import contextlib
import glob
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from timewheel.store.server import find_free_port


def postgres_bin_dir() -> Path:
    """The newest /usr/lib/postgresql/*/bin holding initdb; fails loudly if there is none."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parent.parent.name),
    )
    if not found:
        raise RuntimeError(
            "PostgreSQL server binaries not found in /usr/lib/postgresql/*/bin; "
            "run .ci/bootstrap (apt-get install postgresql)"
        )
    return Path(found[-1]).parent


class PostgresServer:
    """One postgres process with its data directory and socket in a fresh temp dir."""

    def __init__(self) -> None:
        self.bin = postgres_bin_dir()
        # Not under pytest's tmp_path: its parents are mode 0700, and the postgres user
        # must be able to reach the data directory.
        self.root = Path(tempfile.mkdtemp(prefix="tw-pg-"))
        self.data = self.root / "data"
        self.port = find_free_port()
        self.user = "postgres"
        self._as_root = os.geteuid() == 0

    def _run(self, *command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = list(command)
        if self._as_root:
            if shutil.which("runuser") is None:
                raise RuntimeError("running as root needs runuser to start PostgreSQL")
            argv = ["runuser", "-u", "postgres", "--", *argv]
        return subprocess.run(
            argv, check=check, capture_output=True, text=True, stdin=subprocess.DEVNULL
        )

    def start(self) -> None:
        if self._as_root:
            shutil.chown(self.root, "postgres", "postgres")
        else:
            self.user = os.environ.get("USER", "postgres")
        os.chmod(self.root, 0o700)
        done = self._run(
            str(self.bin / "initdb"),
            "-D",
            str(self.data),
            "-U",
            self.user,
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
            check=False,
        )
        if done.returncode:
            raise RuntimeError(f"initdb failed:\n{done.stdout}\n{done.stderr}")
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
            "-c max_connections=50 -c shared_buffers=32MB"
        )
        done = self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.root / "postgres.log"),
            "-o",
            options,
            "-w",
            "-t",
            "30",
            "start",
            check=False,
        )
        if done.returncode:
            log = (self.root / "postgres.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"pg_ctl start failed:\n{done.stdout}\n{done.stderr}\n{log}")

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{dbname}"

    def create_database(self) -> str:
        """A new empty database; returns its DSN."""
        name = "tw_" + secrets.token_hex(4)
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name} TEMPLATE template0")
        return self.dsn(name)

    def stop(self) -> None:
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop", check=False
        )
        # Wait for the postmaster to go before removing its directory.
        deadline = time.monotonic() + 10
        while (self.data / "postmaster.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        with contextlib.suppress(OSError):
            shutil.rmtree(self.root)
