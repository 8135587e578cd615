"""The `timewheel` command line: every subcommand, its flags and their help."""

from __future__ import annotations

import argparse
import os
from dataclasses import fields
from pathlib import Path

from timewheel import __version__
from timewheel.cli.client import add_client_commands
from timewheel.config import Settings

DEV_REDIS_PORT = 6399
DESCRIPTION = """The `timewheel` command: dev, api, scheduler, worker, webhook, archiver, snapshot,
restore, audit, scripts check; and the API client commands task, dlq, tenant, schedule."""


def add_common(p: argparse.ArgumentParser, *, redis_url: bool = True) -> None:
    if redis_url:
        p.add_argument(
            "--redis-url",
            help="Redis URL: standalone, any Cluster node, or a primary under Sentinel "
            "(redis+sentinel://host:26379[,host:port...]/<service>) "
            "(env TIMEWHEEL_REDIS_URL; default redis://127.0.0.1:6379)",
        )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--log-json", action="store_true", help="JSON log lines")


def add_unsafe(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--unsafe-durability",
        action="store_true",
        default=os.environ.get("TIMEWHEEL_UNSAFE_DURABILITY") == "1",
        help="start even if Redis has AOF off or may evict keys (acknowledged tasks can be "
        "lost); env TIMEWHEEL_UNSAFE_DURABILITY=1",
    )


def add_executor_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tenant",
        action="append",
        required=True,
        help="a tenant to serve, or a pattern of registered tenants ('acme-*', '*': "
        "tenants registered later are served too); repeat it to serve several.",
    )
    p.add_argument(
        "--queue",
        action="append",
        help="a queue to serve of every tenant given; repeat it for several (default: default).",
    )
    p.add_argument("--group", default="timewheel", help="consumer group (default timewheel)")
    p.add_argument(
        "--concurrency", type=int, default=10, help="handlers at once, per process (default 10)"
    )
    p.add_argument(
        "--prefetch",
        type=int,
        metavar="N",
        help="runs read ahead beyond the free handler slots, per process (default: as "
        "many as --concurrency); up to 4 times this while handlers finish faster than "
        "reads come back",
    )
    p.add_argument(
        "--processes",
        type=int,
        default=1,
        metavar="N",
        help="consumer processes, each its own consumer of the group, supervised by this "
        "one (default 1)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics on this port (with --processes N: this port and "
        "the N-1 after it, one per process)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address of the metrics server")
    add_common(p)


HTTP_LIMITS = (
    ("http_header_timeout_s", "seconds a connection may take to send a whole request head"),
    ("http_keepalive_s", "seconds an idle kept-alive connection stays open"),
    (
        "http_body_timeout_s",
        "seconds to wait for the next part of a request body, or for the client to take "
        "the next part of an answer",
    ),
    ("http_max_header_bytes", "largest request head; 431 past it"),
    ("http_max_connections", "open connections past which a request is answered 503"),
    ("http_max_body_bytes", "largest request body of any endpoint; 413 past it"),
)
"""The settings of the HTTP server that `api` and `dev` also take as options."""


def add_http_limits(p: argparse.ArgumentParser) -> None:
    defaults = {f.name: f.default for f in fields(Settings)}
    group = p.add_argument_group("HTTP server limits")
    for name, text in HTTP_LIMITS:
        group.add_argument(
            "--" + name.replace("_", "-"),
            type=int,
            metavar="N",
            help=f"{text} (env TIMEWHEEL_{name.upper()}; default {defaults[name]})",
        )


def http_options(args: argparse.Namespace) -> dict[str, int | None]:
    """The HTTP server limits given as options, for Settings.from_env (None: not given)."""
    return {name: getattr(args, name, None) for name, _ in HTTP_LIMITS}


def add_postgres(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--postgres-dsn",
        help="PostgreSQL DSN, e.g. postgresql://user@host:5432/timewheel "
        "(env TIMEWHEEL_POSTGRES_DSN)",
    )
    add_common(p)


def add_audit(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`timewheel audit` (timewheel/cli/audit.py runs it)."""
    summary = "check that no scheduled run was dropped or stuck; exit 1 with findings"
    p = sub.add_parser(
        "audit", help=summary, description=summary + ", 0 when clean, 2 for a usage error"
    )
    p.add_argument("--json", action="store_true", help="print the report as one JSON document")
    p.add_argument(
        "--shard",
        type=int,
        action="append",
        metavar="N",
        help="audit shard N only (default: every shard).",
    )
    p.add_argument(
        "--overdue-s",
        type=float,
        default=60.0,
        help="a run still waiting this long after its due time is overdue (default 60)",
    )
    p.add_argument(
        "--lease-grace-s",
        type=float,
        default=30.0,
        help="how long past its visibility timeout a pending entry may wait for the "
        "reaper (default 30)",
    )
    p.add_argument(
        "--limit", type=int, default=100, help="findings printed (default 100; all are counted)"
    )
    p.add_argument(
        "--archive",
        action="store_true",
        help="also check that every run the archive (TIMEWHEEL_POSTGRES_DSN) holds as "
        "scheduled or dispatched still has its record in Redis (archive_run_lost), and that "
        "the archiver keeps up with every shard's event log (archiver_behind)",
    )
    p.add_argument(
        "--archiver-behind-s",
        type=float,
        default=None,
        help="with --archive: a shard whose first event not archived is older than this is "
        "archiver_behind (default: TIMEWHEEL_AUDIT_ARCHIVER_BEHIND_MS, 60 s)",
    )
    p.add_argument(
        "--events",
        action="store_true",
        help="also check the newest 1,000 entries of each shard's event log against the "
        "records of the runs they name, and each field of each tenant's usage hash against "
        "its records and schedules "
        "(run_lost, event_state_mismatch, usage_mismatch)",
    )
    p.add_argument(
        "--counts",
        action="store_true",
        help="also print each tenant's runs created in the --window-s by archived state, and "
        "its runs not finished as the archive (TIMEWHEEL_POSTGRES_DSN) and Redis count them "
        "(count_mismatch when they differ with every event archived)",
    )
    p.add_argument(
        "--window-s",
        type=float,
        default=3600.0,
        help="the window of --counts: runs created this long ago or later (default 3600)",
    )
    p.add_argument(
        "--repair",
        action="store_true",
        help="also repair what is safe to: put runs back in the wheel, hand lost deliveries "
        "to the retry path, re-index schedules, with --events set usage counts the records "
        "give (no record, member or entry is deleted; each repair is logged)",
    )
    p.add_argument(
        "--parallel",
        type=int,
        default=1,
        metavar="N",
        help="shards audited at once (default 1; more helps on a Cluster)",
    )
    add_common(p)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="timewheel", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"timewheel {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    dev = sub.add_parser(
        "dev",
        help="local redis-server (AOF) and PostgreSQL + API + scheduler + archiver in one process",
    )
    dev.add_argument(
        "--data-dir",
        default=".timewheel",
        type=Path,
        help="where redis-server keeps its AOF, PostgreSQL its cluster and dev its keys "
        "(default ./.timewheel)",
    )
    dev.add_argument(
        "--no-postgres",
        action="store_true",
        help="start no PostgreSQL, hence no archiver and no snapshots",
    )
    dev.add_argument(
        "--snapshot-every",
        type=float,
        default=10.0,
        metavar="MINUTES",
        help="the archiver's snapshot interval (default 10; the first at start if none is "
        "that recent)",
    )
    dev.add_argument(
        "--restore",
        action="store_true",
        help="move the Redis data aside and rebuild Redis from dev's PostgreSQL (newest "
        "snapshot + archived events) before serving",
    )
    dev.add_argument(
        "--new-keys",
        action="store_true",
        help="issue a new admin key and tenant key instead of the ones kept in "
        "<data-dir>/credentials.json (the old tenant key is revoked)",
    )
    dev.add_argument("--host", default="127.0.0.1")
    dev.add_argument("--port", default=8080, type=int, help="API port (default 8080)")
    dev.add_argument(
        "--redis-port",
        default=DEV_REDIS_PORT,
        type=int,
        help=f"port of the local redis-server (default {DEV_REDIS_PORT}; 0 = any free)",
    )
    add_http_limits(dev)
    add_common(dev, redis_url=False)

    api = sub.add_parser("api", help="run the HTTP API")
    api.add_argument("--host", default="127.0.0.1")
    api.add_argument("--port", default=8080, type=int)
    add_http_limits(api)
    add_unsafe(api)
    add_common(api)

    sched = sub.add_parser("scheduler", help="run a scheduler node (any number of them)")
    sched.add_argument("--node-id", help="this node's id (default: host-pid-random)")
    sched.add_argument(
        "--lease-ttl-ms",
        type=int,
        default=2000,
        help="shard lease TTL; renewed every ttl/4 (default 2000)",
    )
    sched.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    add_unsafe(sched)
    sched.add_argument("--host", default="127.0.0.1", help="address of the metrics server")
    add_common(sched)

    worker = sub.add_parser("worker", help="run an executor: a handler function per run")
    worker.add_argument("--app", required=True, help="module:function, the handler")
    add_executor_args(worker)

    hook = sub.add_parser("webhook", help="POST each run's payload to a URL")
    hook.add_argument("--url", help="the URL to POST to")
    hook.add_argument(
        "--allow-host",
        action="append",
        default=[],
        help="take the URL from the payload's 'url' if its host is listed",
    )
    hook.add_argument("--timeout-s", type=float, default=10.0)
    add_executor_args(hook)

    archiver = sub.add_parser(
        "archiver", help="tail every shard's event log into PostgreSQL (and take snapshots)"
    )
    archiver.add_argument(
        "--snapshot-every",
        type=float,
        metavar="MINUTES",
        help="also take a snapshot every MINUTES minutes, the first at start if the newest "
        "is older than that (default: never)",
    )
    archiver.add_argument(
        "--poll-ms", type=int, default=100, help="sleep of an idle round (default 100)"
    )
    add_postgres(archiver)

    snapshot = sub.add_parser(
        "snapshot", help="copy every pending task and schedule into PostgreSQL, once"
    )
    add_postgres(snapshot)

    restore = sub.add_parser(
        "restore", help="rebuild an empty Redis from the newest snapshot and the events after it"
    )
    restore.add_argument(
        "--force", action="store_true", help="restore into a Redis that already holds keys"
    )
    restore.add_argument(
        "--dry-run",
        action="store_true",
        help="say what would be written (counts per kind and per shard); write nothing",
    )
    add_postgres(restore)

    add_audit(sub)

    scripts = sub.add_parser("scripts", help="Lua script tools")
    scripts_sub = scripts.add_subparsers(dest="scripts_command", required=True)
    check = scripts_sub.add_parser(
        "check", help="check headers, and load every script if a Redis URL is given"
    )
    check.add_argument("--redis-url")
    add_client_commands(sub)
    return parser
