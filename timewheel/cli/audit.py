"""`timewheel audit`: check every shard's invariants, report what breaks them, and with
--repair mend what is safe to (timewheel/audit/, docs/operations/auditing.md).

Exit status: 0 clean, 1 with findings (repaired or not: a second pass shows what is
left), 2 for a usage error."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys

from timewheel.audit import AuditOptions, AuditPass
from timewheel.audit.archived import ArchiveCheck
from timewheel.audit.counts import CountCheck
from timewheel.audit.counts import render as render_counts
from timewheel.audit.report import render, to_json
from timewheel.config import Settings
from timewheel.errors import ConfigError
from timewheel.store import deployment
from timewheel.store.connection import connect
from timewheel.store.shard import Store


def _seconds_ms(value: float, flag: str) -> int:
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{flag} must be a number of seconds >= 0")
    return round(value * 1000)


def _archive_checks(
    args: argparse.Namespace, store: Store
) -> tuple[ArchiveCheck | None, CountCheck | None]:
    """The checks against the archive the flags ask for (--archive, --counts)."""
    settings = store.settings
    for flag, wanted in (("--archive", args.archive), ("--counts", args.counts)):
        if wanted and not settings.postgres_dsn:
            raise ConfigError(f"{flag} needs the archive: set TIMEWHEEL_POSTGRES_DSN")
    if args.archiver_behind_s is not None and not args.archive:
        raise ConfigError("--archiver-behind-s needs --archive")
    archive = counts = None
    if args.archive:
        behind_ms = (
            settings.audit_archiver_behind_ms
            if args.archiver_behind_s is None
            else _seconds_ms(args.archiver_behind_s, "--archiver-behind-s")
        )
        archive = ArchiveCheck(store, settings.postgres_dsn, behind_ms=behind_ms)
    if args.counts:
        window_ms = _seconds_ms(args.window_s, "--window-s")
        counts = CountCheck(store, settings.postgres_dsn, window_ms=window_ms)
    return archive, counts


async def run_audit(args: argparse.Namespace) -> int:
    """Run one pass as the flags say; the exit status."""
    options = AuditOptions(
        overdue_ms=_seconds_ms(args.overdue_s, "--overdue-s"),
        lease_grace_ms=_seconds_ms(args.lease_grace_s, "--lease-grace-s"),
        events=args.events,
    )
    if args.limit < 0:
        raise ConfigError("--limit must be >= 0")
    if args.parallel < 1:
        raise ConfigError("--parallel must be >= 1")
    settings = Settings.from_env(None, redis_url=args.redis_url)
    client = await connect(settings.redis_url)
    try:
        layout = await deployment.stored_layout(client, settings.prefix)
        if layout is None:
            raise ConfigError(
                f"no timewheel deployment under prefix {settings.prefix!r} at "
                f"{settings.redis_url} (set TIMEWHEEL_PREFIX?)"
            )
        settings = dataclasses.replace(
            settings, shards=layout["shards"], bucket_ms=layout["bucket_ms"]
        )
        shards = sorted(set(args.shard)) if args.shard else None
        for shard in shards or []:
            if not 0 <= shard < settings.shards:
                last = settings.shards - 1
                raise ConfigError(f"--shard {shard}: the deployment has shards 0..{last}")
        store = Store(client, settings)
        archive, counts = _archive_checks(args, store)
        audit = AuditPass(
            store,
            options,
            shards=shards,
            repair=args.repair,
            keep=args.limit,
            archive=archive,
            counts=counts,
        )
        report = await audit.run(parallel=args.parallel)
    finally:
        await client.aclose()
    if args.json:
        print(json.dumps(to_json(report, args.limit), indent=1), flush=True)
    else:
        if report.tenants:
            sys.stdout.write(render_counts(report.tenants) + "\n")
        sys.stdout.write(render(report, args.limit))
        sys.stdout.flush()
    return 0 if report.clean else 1
