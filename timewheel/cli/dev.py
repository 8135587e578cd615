"""`timewheel dev`: a whole deployment in one process, its data in one folder.

    <data-dir>/redis/             redis-server's config, AOF and log (timewheel/store/server.py)
    <data-dir>/postgres/          PostgreSQL's cluster, log and port (timewheel/archive/server.py)
    <data-dir>/credentials.json   the admin key and tenant default's key, mode 0600

It starts redis-server and PostgreSQL (unless --no-postgres), then runs the HTTP API,
the scheduler and the archiver (with periodic snapshots) until SIGINT or SIGTERM, and
stops the servers. With --restore it first moves the Redis data aside and rebuilds an
empty Redis from its own PostgreSQL (timewheel/archive/restore.py), before anything
else writes to Redis. The keys stay the same across restarts unless --new-keys.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import structlog

from timewheel.cli.parser import http_options
from timewheel.cli.serve import serve
from timewheel.config import Settings
from timewheel.engine import Engine
from timewheel.errors import ConfigError, Conflict, Unauthorized
from timewheel.store.server import RedisServer
from timewheel.tenants import Limits, TenantStore, new_key

log = structlog.get_logger("timewheel.dev")

DEFAULT_TENANT = "default"
CREDENTIALS_FILE = "credentials.json"


@dataclass(slots=True)
class Credentials:
    """The keys dev hands out, kept in <data-dir>/credentials.json (mode 0600)."""

    admin_key: str = ""
    tenant_key: str = ""

    @classmethod
    def load(cls, path: Path) -> Credentials:
        """The stored keys; empty ones when there is no (readable) file."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            return cls()
        return cls(str(data.get("admin_key", "")), str(data.get("tenant_key", "")))

    def save(self, path: Path) -> None:
        """Write the file readable by its owner only (written aside, then renamed)."""
        aside = path.with_suffix(".tmp")
        fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump({"admin_key": self.admin_key, "tenant_key": self.tenant_key}, out)
            out.write("\n")
        os.chmod(aside, 0o600)  # the file may have existed with a wider mode
        os.replace(aside, path)


def move_redis_aside(redis_dir: Path) -> Path | None:
    """Rename a Redis data folder that holds anything to redis.before-restore-<UTC time>;
    returns the new path (None when there was nothing to move)."""
    if not redis_dir.is_dir() or not any(redis_dir.iterdir()):
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = redis_dir.with_name(f"{redis_dir.name}.before-restore-{stamp}")
    n = 1
    while target.exists():  # two restores within a second
        n += 1
        target = redis_dir.with_name(f"{redis_dir.name}.before-restore-{stamp}-{n}")
    redis_dir.rename(target)
    return target


async def tenant_key(engine: Engine, stored: str, *, new: bool) -> str:
    """Tenant default's key: the stored one while Redis still knows it (and `new` is
    false), else a newly issued one. With `new`, the stored key is revoked."""
    store = TenantStore(engine.client, engine.keys)
    with contextlib.suppress(Conflict):
        await store.create_tenant(DEFAULT_TENANT, Limits())
    if stored:
        try:
            principal = await store.authenticate(f"Bearer {stored}")
        except Unauthorized:
            principal = None
        if principal is not None and principal.tenant == DEFAULT_TENANT:
            if not new:
                return stored
            await store.revoke_key(DEFAULT_TENANT, principal.key_id)
    _, key = await store.issue_key(DEFAULT_TENANT)
    return key


async def _restore(settings: Settings) -> None:
    from timewheel.archive.restore import restore

    result = await restore(settings)
    print(
        f"timewheel dev: restored {result.restored} runs from snapshot {result.snapshot_id} "
        f"({result.events_replayed} events replayed)",
        file=sys.stderr,
        flush=True,
    )


DRAIN_S = 10.0
"""How long a stopping dev archives what is left at most."""


async def _archive(engine: Engine, dsn: str, stop: asyncio.Event, every_s: float) -> None:
    """The archiver with its snapshots, until `stop`; a failure stops dev (loudly) rather
    than leaving it running without an archive."""
    from timewheel.archive import pg
    from timewheel.archive.archiver import Archiver

    conn = await pg.connect(dsn)
    archiver = Archiver(engine.store, conn)
    try:
        await archiver.start()
        await archiver.run(stop, snapshot_every_s=every_s, dsn=dsn, drain_s=DRAIN_S)
    finally:
        await archiver.conn.close()


async def run_dev(args: argparse.Namespace) -> None:
    """Run `timewheel dev` with the parsed `args` until a signal."""
    from timewheel.archive.server import LocalPostgres

    if args.snapshot_every <= 0:
        raise ConfigError("--snapshot-every must be a positive number of minutes")
    data_dir: Path = args.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    redis_dir = data_dir / "redis"
    if args.restore:
        if args.no_postgres:
            raise ConfigError("--restore restores from dev's PostgreSQL: drop --no-postgres")
        moved = move_redis_aside(redis_dir)
        if moved is not None:
            print(f"timewheel dev: moved the Redis data to {moved}", file=sys.stderr, flush=True)
    redis_dir.mkdir(parents=True, exist_ok=True)
    # dev's own API, scheduler and archiver reach Redis over its Unix socket (less CPU a
    # call than loopback TCP); the TCP port stays for redis-cli, workers and the rest.
    server = RedisServer(redis_dir, port=args.redis_port, unix_socket=True)
    postgres = None if args.no_postgres else LocalPostgres(data_dir / "postgres")
    server.start()
    try:
        if postgres is not None:
            postgres.start()
        dsn = "" if postgres is None else postgres.dsn()
        settings = Settings.from_env(
            None, redis_url=server.local_url, postgres_dsn=dsn or None, **http_options(args)
        )
        await _serve(args, settings, server, data_dir)
    finally:
        if postgres is not None:
            postgres.stop()
        server.stop()


async def _serve(
    args: argparse.Namespace, settings: Settings, server: RedisServer, data_dir: Path
) -> None:
    credentials_path = data_dir / CREDENTIALS_FILE
    credentials = Credentials() if args.new_keys else Credentials.load(credentials_path)
    admin_from_env = bool(settings.admin_key)
    if not admin_from_env:
        credentials.admin_key = credentials.admin_key or new_key()
        settings = dataclasses.replace(settings, admin_key=credentials.admin_key)
    if args.restore:
        await _restore(settings)
    engine = await Engine.connect(settings)
    try:
        stored = Credentials.load(credentials_path).tenant_key
        credentials.tenant_key = await tenant_key(engine, stored, new=args.new_keys)
        credentials.save(credentials_path)
        archive = f", PostgreSQL {settings.postgres_dsn}" if settings.postgres_dsn else ""
        socket = f" and {server.local_url}" if server.socket_path is not None else ""
        print(
            f"timewheel dev: API http://{args.host}:{args.port}  redis {server.url}{socket} "
            f"(AOF, appendfsync always, in {data_dir / 'redis'}){archive}  "
            f"keys in {credentials_path}  Ctrl-C stops all",
            file=sys.stderr,
            flush=True,
        )
        if not admin_from_env:
            print(f"export TIMEWHEEL_ADMIN_KEY={settings.admin_key}", flush=True)
        print(f"export TIMEWHEEL_KEY={credentials.tenant_key}   # tenant 'default'", flush=True)
        print(f"export TIMEWHEEL_URL=http://{args.host}:{args.port}", flush=True)
        if settings.postgres_dsn:
            print(f"export TIMEWHEEL_POSTGRES_DSN={settings.postgres_dsn}", flush=True)
        stop = asyncio.Event()
        # The archiver stops after the API and the scheduler, and archives what they
        # wrote last before it exits (DRAIN_S), so a stopped dev holds nothing in Redis
        # alone that the archive lacks.
        archiver_stop = asyncio.Event()
        archiver: asyncio.Task[None] | None = None
        if settings.postgres_dsn:
            archiver = asyncio.create_task(
                _archive(engine, settings.postgres_dsn, archiver_stop, args.snapshot_every * 60)
            )
            archiver.add_done_callback(lambda _: stop.set())
        try:
            await serve(engine, api=True, scheduler=True, host=args.host, port=args.port, stop=stop)
        finally:
            stop.set()
            archiver_stop.set()
            if archiver is not None:
                await archiver  # re-raises what stopped it
    finally:
        await engine.close()
