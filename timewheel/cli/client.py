"""`timewheel task|dlq|tenant|schedule ...`: the HTTP API from a shell, through the SDK.

Output is a table for people or JSON with --json. A refused request prints one line
(`timewheel: 404 not_found: ...`) and exits 1; a bad argument exits 2 (argparse), and so
does a create the deployment is too full to take (507 storage_full: nothing was created,
and retrying will not help until an operator frees memory).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from timewheel.errors import ValidationError
from timewheel.sdk.client import Client

CLIENT_COMMANDS = ("task", "dlq", "tenant", "schedule")
SCHEDULE_ACTIONS = ("get", "delete", "pause", "resume", "trigger", "runs")
TASK_COLUMNS = ("id", "queue", "state", "attempt", "run_at")
SCHEDULE_COLUMNS = ("id", "cron", "every_s", "queue", "state", "next_run_at")
DEAD_COLUMNS = ("run_id", "queue", "attempt", "reason", "dead_at", "error")


def _json_arg(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (0 or more)")
    return int(text)


_UNSET = object()
"""A tenant-update option not given (None, from 'none', clears the limit)."""


def _or_none(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An option type that also takes 'none' (clear the setting)."""

    def parse_or_none(text: str) -> Any:
        return None if text.lower() == "none" else parse(text)

    parse_or_none.__name__ = getattr(parse, "__name__", "value")
    return parse_or_none


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


LIMIT_OPTIONS: tuple[tuple[str, Callable[[str], Any]], ...] = (
    ("--max-payload-bytes", _positive_int),
    ("--max-pending", _positive_int),
    ("--dispatch-rate", _positive_float),
    ("--max-payload-total-bytes", _positive_int),
    ("--max-schedules", _positive_int),
    ("--max-queues", _positive_int),
    ("--min-interval-s", _positive_float),
    ("--max-backlog", _count),
    ("--shards", _positive_int),
)
"""A tenant's limits as options of `tenant create` and `tenant update`."""


def _connection(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="API base URL (env TIMEWHEEL_URL; default http://127.0.0.1:8080)")
    p.add_argument("--key", help="API key (env TIMEWHEEL_KEY)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _when(p: argparse.ArgumentParser, *, required: bool) -> None:
    group = p.add_mutually_exclusive_group(required=required)
    group.add_argument("--delay", type=float, help="seconds from now")
    group.add_argument("--run-at", help="RFC 3339 time with offset, e.g. 2026-12-01T09:00:00Z")


def add_client_commands(sub: Any) -> None:
    """Add the task, dlq and tenant subcommands to the `timewheel` parser."""
    task = sub.add_parser("task", help="tasks of your tenant (via the HTTP API)")
    tsub = task.add_subparsers(dest="action", required=True)
    create = tsub.add_parser("create", help="schedule a task")
    _when(create, required=True)
    create.add_argument("--queue")
    create.add_argument("--payload", type=_json_arg, help="JSON payload")
    create.add_argument("--idempotency-key")
    create.add_argument("--max-attempts", type=_positive_int)
    for name, helptext in (
        ("get", "show a task"),
        ("cancel", "cancel a scheduled task"),
        ("runs", "a task's run history"),
    ):
        p = tsub.add_parser(name, help=helptext)
        p.add_argument("task_id")
        _connection(p)
    resched = tsub.add_parser("reschedule", help="move a scheduled task (and/or new payload)")
    resched.add_argument("task_id")
    _when(resched, required=False)
    resched.add_argument("--payload", type=_json_arg)
    listing = tsub.add_parser("list", help="list tasks")
    listing.add_argument("--queue")
    listing.add_argument(
        "--state", choices=["scheduled", "dispatched", "succeeded", "cancelled", "dead"]
    )
    listing.add_argument("--limit", type=_positive_int, default=100, help="at most (default 100)")
    listing.add_argument("--cursor", help="go on from a cursor a previous listing printed")
    for p in (create, resched, listing):
        _connection(p)

    dlq = sub.add_parser("dlq", help="dead letters of your tenant")
    dsub = dlq.add_subparsers(dest="action", required=True)
    dlist = dsub.add_parser("list", help="list dead letters, oldest first")
    dlist.add_argument("--limit", type=_positive_int, default=100)
    dlist.add_argument("--cursor")
    _connection(dlist)
    for name, helptext in (("replay", "back into the wheel, due now"), ("purge", "delete")):
        p = dsub.add_parser(name, help=helptext)
        p.add_argument("run_id")
        _connection(p)

    sched = sub.add_parser("schedule", help="recurring schedules of your tenant")
    ssub = sched.add_subparsers(dest="action", required=True)
    screate = ssub.add_parser("create", help="create a schedule (cron or --every-s)")
    every = screate.add_mutually_exclusive_group(required=True)
    every.add_argument("--cron", help="cron expression, e.g. '0 9 * * mon-fri'")
    every.add_argument("--every-s", type=float, help="every N seconds")
    screate.add_argument("--timezone", help="IANA zone of the cron expression")
    screate.add_argument("--queue")
    screate.add_argument("--payload", type=_json_arg)
    screate.add_argument("--catchup", choices=["skip", "latest", "all"])
    screate.add_argument("--overlap", choices=["allow", "skip", "buffer_one"])
    screate.add_argument(
        "--jitter-s", type=_positive_float, help="runs due a fixed offset up to this after fire"
    )
    screate.add_argument("--paused", action="store_true", default=None)
    _connection(screate)
    slist = ssub.add_parser("list", help="your schedules (every page)")
    _connection(slist)
    for name in SCHEDULE_ACTIONS:
        p = ssub.add_parser(name, help=f"{name} a schedule")
        p.add_argument("schedule_id")
        _connection(p)

    tenant = sub.add_parser("tenant", help="tenants and API keys (admin key)")
    nsub = tenant.add_subparsers(dest="action", required=True)
    tcreate = nsub.add_parser("create", help="register a tenant")
    tcreate.add_argument("tenant_id")
    tupdate = nsub.add_parser(
        "update", help="change a tenant's limits ('none' clears one: the default applies)"
    )
    tupdate.add_argument("tenant_id")
    for option, parse in LIMIT_OPTIONS:
        tcreate.add_argument(option, type=parse)
        tupdate.add_argument(option, type=_or_none(parse), default=_UNSET)
    _connection(tcreate)
    _connection(tupdate)
    key = nsub.add_parser("key", help="issue a key for a tenant (or --revoke KEY_ID)")
    key.add_argument("tenant_id")
    key.add_argument("--revoke", metavar="KEY_ID", help="revoke this key instead")
    _connection(key)


def _cell(value: Any, width: int = 60) -> str:
    text = "" if value is None else value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def table(rows: Sequence[Mapping[str, object]], columns: Sequence[str]) -> str:
    """Rows as aligned text columns."""
    if not rows:
        return "(none)"
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def _record(obj: dict[str, Any]) -> str:
    return "\n".join(f"{k + ':':14} {_cell(v, 400)}" for k, v in obj.items())


def _list_tasks(tw: Client, args: argparse.Namespace) -> tuple[list[Any], str | None]:
    items: list[Any] = []
    cursor = args.cursor
    for _ in range(10_000):  # bounded; pages may be short, the cursor says when it ends
        page = tw.list_tasks(
            queue=args.queue,
            state=args.state,
            limit=min(1000, args.limit - len(items)),
            cursor=cursor,
        )
        items.extend(page["items"])
        cursor = page["next_cursor"]
        if cursor is None or len(items) >= args.limit:
            break
    return items, cursor


def _task(tw: Client, args: argparse.Namespace) -> tuple[Any, str]:
    if args.action == "create":
        retry = {"max_attempts": args.max_attempts} if args.max_attempts else None
        task = tw.create_task(
            delay=args.delay,
            run_at=args.run_at,
            queue=args.queue,
            payload=args.payload,
            idempotency_key=args.idempotency_key,
            retry=retry,
        )
        return task, table([dict(task)], TASK_COLUMNS)
    if args.action == "reschedule":
        fields: dict[str, Any] = {"delay": args.delay, "run_at": args.run_at}
        if args.payload is not None:
            fields["payload"] = args.payload
        task = tw.update_task(args.task_id, **fields)
        return task, table([dict(task)], TASK_COLUMNS)
    if args.action == "get":
        task = tw.get_task(args.task_id)
        return task, _record(dict(task))
    if args.action == "cancel":
        task = tw.cancel_task(args.task_id)
        return task, table([dict(task)], TASK_COLUMNS)
    if args.action == "runs":
        runs = tw.task_runs(args.task_id)
        return runs, table(runs["events"], ("event", "at", "attempt", "reason", "error"))
    items, cursor = _list_tasks(tw, args)
    text = table(items, TASK_COLUMNS) + (f"\nnext cursor: {cursor}" if cursor else "")
    return {"items": items, "next_cursor": cursor}, text


def _dlq(tw: Client, args: argparse.Namespace) -> tuple[Any, str]:
    if args.action == "list":
        page = tw.list_dead_letters(limit=min(args.limit, 1000), cursor=args.cursor)
        cursor = page["next_cursor"]
        text = table(page["items"], DEAD_COLUMNS) + (f"\nnext cursor: {cursor}" if cursor else "")
        return page, text
    if args.action == "replay":
        out = tw.replay_dead_letter(args.run_id)
        return out, f"{out['run_id']} replayed: scheduled at {out['run_at']}"
    out = tw.purge_dead_letter(args.run_id)
    return out, f"{out['run_id']} purged"


def _limit_name(option: str) -> str:
    return option.removeprefix("--").replace("-", "_")


def _tenant(tw: Client, args: argparse.Namespace) -> tuple[Any, str]:
    names = [_limit_name(option) for option, _ in LIMIT_OPTIONS]
    if args.action == "create":
        given = {n: getattr(args, n) for n in names}
        tenant = tw.create_tenant(args.tenant_id, **given)
        return tenant, _record(dict(tenant))
    if args.action == "update":
        limits = {n: getattr(args, n) for n in names if getattr(args, n) is not _UNSET}
        if not limits:
            options = ", ".join(option for option, _ in LIMIT_OPTIONS)
            raise ValidationError(f"tenant update: give {options}")
        tenant = tw.update_tenant(args.tenant_id, limits)
        return tenant, _record(dict(tenant))
    if args.revoke:
        out = tw.revoke_key(args.tenant_id, args.revoke)
        return out, f"key {out['key_id']} revoked"
    key = tw.create_key(args.tenant_id)
    return key, _record(dict(key)) + "\n(the key is shown only now; store it)"


def _schedule(tw: Client, args: argparse.Namespace) -> tuple[Any, str]:
    if args.action == "create":
        out = tw.create_schedule(
            cron=args.cron,
            every_s=args.every_s,
            timezone=args.timezone,
            queue=args.queue,
            payload=args.payload,
            catchup=args.catchup,
            overlap=args.overlap,
            paused=args.paused,
            jitter_s=args.jitter_s,
        )
        return out, _record(out)
    if args.action == "list":
        items: list[Any] = []
        cursor = None
        for _ in range(100_000):  # bounded; pages may be short, the cursor says when it ends
            page = tw.list_schedules(limit=1000, cursor=cursor)
            items.extend(page["items"])
            cursor = page["next_cursor"]
            if cursor is None:
                break
        return items, table(items, SCHEDULE_COLUMNS)
    method = getattr(tw, f"{args.action}_schedule" if args.action != "runs" else "schedule_runs")
    out = method(args.schedule_id)
    return out, _record(out)


def run_client_command(args: argparse.Namespace) -> int:
    """Run a task/dlq/tenant command; ApiError and TransportError propagate to main()."""
    with Client(args.url, args.key) as tw:
        run = {"task": _task, "dlq": _dlq, "tenant": _tenant, "schedule": _schedule}[args.command]
        data, text = run(tw, args)
    try:
        print(json.dumps(data, indent=2) if args.json else text)
        sys.stdout.flush()
    except BrokenPipeError:  # `| head`: the reader is gone, which is not an error here
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
