"""The `timewheel` command: parse (timewheel/cli/parser.py), then run one subcommand;
the API client commands are in timewheel/cli/client.py."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Coroutine, Sequence
from typing import Any

import structlog
from redis.exceptions import RedisError

from timewheel.cli.audit import run_audit
from timewheel.cli.client import CLIENT_COMMANDS, run_client_command
from timewheel.cli.dev import run_dev
from timewheel.cli.executors import run_executor, run_fast
from timewheel.cli.parser import build_parser, http_options
from timewheel.cli.serve import serve
from timewheel.config import Settings
from timewheel.engine import Engine
from timewheel.errors import (
    ConfigError,
    StorageFullError,
    TimewheelError,
    ValidationError,
)
from timewheel.logs import configure
from timewheel.store import deployment
from timewheel.store.library import OPERATIONS, Library, ScriptCode, function_name, header_codes

log = structlog.get_logger("timewheel")


def _settings(args: argparse.Namespace, redis_url: str | None = None) -> Settings:
    return Settings.from_env(
        None, redis_url=redis_url or getattr(args, "redis_url", None), **http_options(args)
    )


async def _run(args: argparse.Namespace, *, api: bool, scheduler: bool) -> None:
    if getattr(args, "lease_ttl_ms", 2000) < 100:
        raise ConfigError("--lease-ttl-ms must be at least 100")
    engine = await Engine.connect(_settings(args))
    if api and not engine.settings.admin_key:
        log.warning(
            "no_admin_key",
            detail="TIMEWHEEL_ADMIN_KEY is unset: tenants and keys cannot be managed over HTTP",
        )
    try:
        if not args.unsafe_durability:
            await deployment.check_durability(engine.client, engine.settings)
        await serve(
            engine,
            api=api,
            scheduler=scheduler,
            host=getattr(args, "host", "127.0.0.1"),
            port=getattr(args, "port", 8080),
            node=getattr(args, "node_id", None),
            lease_ttl_ms=getattr(args, "lease_ttl_ms", 2000),
            metrics_port=getattr(args, "metrics_port", None),
        )
    finally:
        await engine.close()


def _archive_settings(args: argparse.Namespace) -> Settings:
    settings = Settings.from_env(
        redis_url=getattr(args, "redis_url", None), postgres_dsn=args.postgres_dsn
    )
    if not settings.postgres_dsn:
        raise ConfigError("no PostgreSQL DSN: pass --postgres-dsn or set TIMEWHEEL_POSTGRES_DSN")
    return settings


async def _run_archiver(args: argparse.Namespace) -> None:
    from timewheel.archive import pg
    from timewheel.archive.archiver import Archiver

    if args.snapshot_every is not None and args.snapshot_every <= 0:
        raise ConfigError("--snapshot-every must be a positive number of minutes")
    if args.poll_ms < 1:
        raise ConfigError("--poll-ms must be at least 1")
    settings = _archive_settings(args)
    conn = await pg.connect(settings.postgres_dsn)
    archiver: Archiver | None = None
    try:
        engine = await Engine.connect(settings)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            archiver = Archiver(engine.store, conn)
            await archiver.start()
            every = None if args.snapshot_every is None else args.snapshot_every * 60
            await archiver.run(
                stop,
                poll_interval_s=args.poll_ms / 1000,
                snapshot_every_s=every,
                dsn=settings.postgres_dsn,
                drain_s=5.0,  # within a container runtime's 10 s stop grace
            )
        finally:
            await engine.close()
    finally:
        # The archiver replaces a connection that broke; close whichever it holds.
        await (archiver.conn if archiver is not None else conn).close()


async def _run_snapshot(args: argparse.Namespace) -> None:
    from timewheel.archive import pg
    from timewheel.archive.snapshot import take_snapshot

    settings = _archive_settings(args)
    async with pg.connection(settings.postgres_dsn) as conn:
        await pg.migrate(conn)
        engine = await Engine.connect(settings)
        try:
            result = await take_snapshot(engine.store, conn)
        finally:
            await engine.close()
    print(
        f"snapshot {result.snapshot_id}: {result.tasks} tasks, {result.schedules} schedules",
        flush=True,
    )


async def _run_restore(args: argparse.Namespace) -> None:
    from timewheel.archive.progress import for_stderr
    from timewheel.archive.restore import restore

    result = await restore(
        _archive_settings(args), force=args.force, dry_run=args.dry_run, progress=for_stderr()
    )
    if result.dry_run:
        for shard in result.shards:
            print(
                f"shard {shard.shard}: {shard.pending} pending, {shard.finished} finished, "
                f"{shard.dead} dead letters, {shard.expired} past retention, "
                f"{shard.events_replayed} events replayed",
                flush=True,
            )
    print(result.summary(), flush=True)


_ARCHIVE_COMMANDS = {
    "archiver": _run_archiver,
    "snapshot": _run_snapshot,
    "restore": _run_restore,
}


async def _scripts_check(args: argparse.Namespace) -> None:
    expected = {code.value: code.name for code in ScriptCode}
    library = Library.build()
    for name in OPERATIONS:
        for code, label in header_codes(name).items():
            if expected.get(code) != label:
                raise ConfigError(f"lua/{name}.lua documents {code} {label}, unknown to ScriptCode")
        print(f"{name:18} {function_name(library.version, name)}")
    if args.redis_url:
        from timewheel.store.connection import connect

        client = await connect(args.redis_url)
        try:
            await library.load(client)
        except RedisError as exc:
            raise ConfigError(f"library {library.name} failed to load: {exc}") from exc
        finally:
            await client.aclose()
        print(f"library {library.name} ({len(OPERATIONS)} functions) loads on {args.redis_url}")


def _run_fast(main: Coroutine[Any, Any, None]) -> None:
    """Run on uvloop when it is installed (uvicorn[standard] brings it): the API serves
    about twice the requests per core. uvicorn runs inside our loop, so its own `loop`
    setting would not apply."""
    run_fast(main)


def _dispatch(args: argparse.Namespace) -> int:
    """Run the command `args` names; its exit status."""
    if args.command == "dev":
        _run_fast(run_dev(args))
    elif args.command == "api":
        _run_fast(_run(args, api=True, scheduler=False))
    elif args.command == "scheduler":
        asyncio.run(_run(args, api=False, scheduler=True))
    elif args.command in ("worker", "webhook"):
        return run_executor(args, run_fast)
    elif args.command in _ARCHIVE_COMMANDS:
        asyncio.run(_ARCHIVE_COMMANDS[args.command](args))
    elif args.command == "audit":
        return asyncio.run(run_audit(args))
    elif args.command == "scripts":
        asyncio.run(_scripts_check(args))
    elif args.command in CLIENT_COMMANDS:
        return run_client_command(args)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command not in CLIENT_COMMANDS:  # client commands print results, not logs
        configure(getattr(args, "log_level", "info"), json=getattr(args, "log_json", False))
    try:
        return _dispatch(args)
    except (ConfigError, ValidationError, StorageFullError) as exc:
        print(f"timewheel: {exc}", file=sys.stderr)
        return 2
    except TimewheelError as exc:
        print(f"timewheel: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
