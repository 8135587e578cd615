"""Restore: rebuild an empty Redis from the newest snapshot plus the events archived after it.

First the tenants, their limits and the hashes of their live API keys
(timewheel/archive/tenancy.py). Then per shard: its plan, read from PostgreSQL
(timewheel/archive/replay.py: the snapshot's runs with the shard's events after it
replayed), written into Redis (timewheel/archive/writeback.py: the pending runs, the dead
letters and the finished runs within retention, each through its restore Lua script),
the next shard's plan read while this one is written. Last the schedules, with their
cursors. Every Lua call counts what it writes in the tenant's usage hashes, so limits
(max_pending, bytes, queues, schedules) hold at once.

`dry_run` reads PostgreSQL only and reports what a restore would write; `progress`
hears of each step (timewheel/archive/progress.py draws it for the CLI).

What is not restored: events Redis wrote after the archiver's last commit, and finished
records whose retention had ended.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import structlog
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from timewheel.archive import pg, tenancy
from timewheel.archive.replay import (
    RestoredRun,
    ShardSummary,
    apply_event,
    newest_snapshot,
    plan_shard,
    plans,
    schedule_count,
)
from timewheel.archive.writeback import (
    open_tenant_log,
    restore_shard,
    write_schedule_hashes,
)
from timewheel.config import Settings
from timewheel.errors import RedisUnavailable, RestoreRefused
from timewheel.store import deployment
from timewheel.store.connection import RedisClient, connect
from timewheel.store.shard import Store

__all__ = [
    "Progress",
    "RestoreResult",
    "RestoredRun",
    "ShardSummary",
    "apply_event",
    "restore",
    "write_schedule_hashes",
]

log = structlog.get_logger("timewheel.restore")


@dataclass(frozen=True, slots=True)
class RestoreResult:
    snapshot_id: int
    restored: int
    """Pending runs written."""
    existing: int
    events_replayed: int
    skipped_no_payload: int
    finished: int = 0
    dead: int = 0
    expired: int = 0
    schedules: int = 0
    tenants: int = 0
    keys: int = 0
    revoked_keys: int = 0
    """Revoked keys, left out."""
    seconds: float = 0.0
    dry_run: bool = False
    shards: Sequence[ShardSummary] = field(default_factory=tuple)

    def summary(self) -> str:
        """The one line the CLI ends with."""
        verb = "would restore" if self.dry_run else "restored"
        return (
            f"{verb} {self.restored} runs from snapshot {self.snapshot_id} "
            f"({self.finished} finished, {self.dead} dead letters, {self.schedules} schedules, "
            f"{self.tenants} tenants, {self.keys} keys; {self.events_replayed} events "
            f"replayed, {self.existing} already present, {self.expired} past retention, "
            f"{self.skipped_no_payload} skipped for lack of a payload) in {self.seconds:.1f} s"
        )


class Progress(Protocol):
    """Hears of restore's steps: `begin` with their number, `step` after each."""

    def begin(self, steps: int) -> None: ...
    def step(self, what: str, **counts: int) -> None: ...
    def end(self) -> None: ...


class _Quiet:
    def begin(self, steps: int) -> None:
        del steps

    def step(self, what: str, **counts: int) -> None:
        del what, counts

    def end(self) -> None:
        pass


async def _key_count(client: RedisClient) -> int:
    """Keys in the server, or in every primary of a Cluster."""
    try:
        if isinstance(client, RedisCluster):
            total = 0
            for node in client.get_primaries():
                total += int(await client.dbsize(target_nodes=node))
            return total
        return int(await client.dbsize())
    except (RedisError, OSError) as exc:
        raise RedisUnavailable(f"cannot count keys: {exc}") from exc


async def restore(
    settings: Settings,
    *,
    force: bool = False,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> RestoreResult:
    """Rebuild the deployment in `settings.redis_url` from `settings.postgres_dsn`.

    `dry_run`: read PostgreSQL only, write nothing (Redis is not even connected to),
    and return what a restore would write.

    Raises:
        RestoreRefused: Redis holds keys and `force` is false, or there is no snapshot.
        ConfigError: the snapshot was taken with another prefix, shard count or bucket width.
        PostgresUnavailable, RedisUnavailable: a server failed.
    """
    began = time.monotonic()
    steps = progress or _Quiet()
    cutoff_ms = int(time.time() * 1000) - settings.retention_ms
    try:
        async with pg.connection(settings.postgres_dsn) as conn:
            snapshot = await newest_snapshot(conn, settings)
            archived = await tenancy.load(conn)
            steps.begin(settings.shards + 2)
            if dry_run:
                steps.step("tenants", tenants=len(archived.tenants), keys=len(archived.keys))
                shards = []
                for shard in range(settings.shards):
                    plan = await plan_shard(conn, snapshot, shard, cutoff_ms)
                    shards.append(plan.summary(shard))
                    steps.step(f"shard {shard}", **_counts(shards[-1]))
                schedules = await schedule_count(conn)
                steps.step("schedules", schedules=schedules)
            else:
                client = await connect(settings.redis_url)
                store = Store(client, settings)
                try:
                    keys = await _key_count(client)
                    if keys and not force:
                        raise RestoreRefused(
                            f"Redis at {settings.redis_url} is not empty ({keys} keys); restore "
                            "writes into an empty Redis only (pass --force to add the snapshot's "
                            "runs to it, leaving runs already there untouched)"
                        )
                    await deployment.ensure_layout(client, settings, store.scripts.library.name)
                    await tenancy.write_back(client, store.keys, archived)
                    await open_tenant_log(store, conn)
                    steps.step("tenants", tenants=len(archived.tenants), keys=len(archived.keys))
                    shards = []
                    shard_plans = plans(conn, snapshot, settings.shards, cutoff_ms)
                    async with contextlib.aclosing(shard_plans):
                        async for shard, plan in shard_plans:
                            done = await restore_shard(store, conn, snapshot, shard, plan)
                            shards.append(done)
                            steps.step(f"shard {shard}", **_counts(done))
                    schedules = await write_schedule_hashes(store, conn, snapshot)
                    steps.step("schedules", schedules=schedules)
                finally:
                    await store.close()
    finally:
        steps.end()
    result = RestoreResult(
        snapshot,
        restored=sum(s.pending for s in shards),
        existing=sum(s.existing for s in shards),
        events_replayed=sum(s.events_replayed for s in shards),
        skipped_no_payload=sum(s.skipped_no_payload for s in shards),
        finished=sum(s.finished for s in shards),
        dead=sum(s.dead for s in shards),
        expired=sum(s.expired for s in shards),
        schedules=schedules,
        tenants=len(archived.tenants),
        keys=len(archived.keys),
        revoked_keys=archived.revoked,
        seconds=time.monotonic() - began,
        dry_run=dry_run,
        shards=tuple(shards),
    )
    log.info(
        "restore_planned" if dry_run else "restored",
        snapshot_id=snapshot,
        runs=result.restored,
        finished=result.finished,
        dead=result.dead,
        schedules=result.schedules,
        tenants=result.tenants,
        keys=result.keys,
        existing=result.existing,
        events_replayed=result.events_replayed,
        skipped_no_payload=result.skipped_no_payload,
        seconds=round(result.seconds, 3),
    )
    return result


def _counts(s: ShardSummary) -> dict[str, int]:
    return {"pending": s.pending, "finished": s.finished, "dead": s.dead}
