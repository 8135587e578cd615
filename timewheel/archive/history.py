"""A run's history, read from its shard's event log (capped; the archiver keeps it all).

When a PostgreSQL DSN is configured (the archiver runs) and the event log no longer holds
the run's `created` event, the archived events are read from PostgreSQL and the newer
ones still only in Redis are added after them. If PostgreSQL cannot be read, the answer
is what Redis holds, and a warning is logged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
import structlog
from redis.exceptions import RedisError

from timewheel.archive import pg
from timewheel.archive.events import (
    BATCHED,
    BatchedRun,
    StreamId,
    batched_runs,
    created_runs,
    parse_id,
)
from timewheel.errors import ConfigError, PostgresUnavailable, RedisUnavailable
from timewheel.store.shard import Store

log = structlog.get_logger("timewheel.history")


@dataclass(frozen=True, slots=True)
class RunEvent:
    """One change of a run: created, updated, cancelled, dispatched, acked,
    retry_scheduled, dead, replayed, purged."""

    kind: str
    at_ms: int
    attempt: int | None = None
    reason: str | None = None
    error: str | None = None
    node: str | None = None


def _event(
    kind: str, f: dict[bytes, bytes], attempt: int | None, run: BatchedRun | None = None
) -> RunEvent:
    """A RunEvent from an event-log entry's fields (`attempt` found by the caller: a
    dispatched entry carries one per run; `run`: the run's part of a batched entry)."""
    error = f[b"error"].decode() if b"error" in f else None
    return RunEvent(
        kind=kind,
        at_ms=int(f[b"at"]),
        attempt=attempt,
        reason=f[b"reason"].decode() if b"reason" in f else None,
        error=run.error if run is not None else error,
        node=f[b"node"].decode() if f.get(b"node") else None,
    )


async def run_history(store: Store, tenant: str, run_id: str) -> list[RunEvent]:
    """Every event of `run_id` in the event log (or archived, see the module doc), oldest first.

    Raises:
        TaskNotFound: the id is not one of this deployment's.
        RedisUnavailable: the event log cannot be read.
    """
    shard = store.locate(run_id)
    found = await _from_redis(store, tenant, run_id, shard)
    if store.settings.postgres_dsn and not any(kind == "created" for _, kind, _ in found):
        try:
            archived = await _from_postgres(store.settings.postgres_dsn, tenant, run_id)
        except (PostgresUnavailable, ConfigError) as exc:
            # Degrade to what Redis still holds rather than fail the request (the API
            # maps errors it does not know to 500).
            log.warning("history_fallback_failed", run_id=run_id, error=str(exc))
            archived = []
        if archived:
            newest = archived[-1][0]
            found = archived + [item for item in found if item[0] > newest]
    events = [event for _, _, event in found]
    if not any(e.kind != "dispatched" for e in events):
        return []  # only dispatches left in the log: the tenant cannot be told, show none
    return events


async def _from_redis(
    store: Store, tenant: str, run_id: str, shard: int
) -> list[tuple[StreamId, str, RunEvent]]:
    try:
        entries: Any = await store.client.xrange(store.keys.events(shard))
    except (RedisError, OSError) as exc:
        raise RedisUnavailable(f"cannot read the event log: {exc}") from exc
    out: list[tuple[StreamId, str, RunEvent]] = []
    for entry_id, f in entries:
        event = _run_event(f, tenant, run_id)
        if event is not None:
            out.append((parse_id(entry_id), event.kind, event))
    return out


def _run_event(f: dict[bytes, bytes], tenant: str, run_id: str) -> RunEvent | None:
    """What an event-log entry says of one tenant's run, or None if it does not name it."""
    # A dispatched entry lists runs of several tenants and names none; a created, acked
    # or retry_scheduled one that lists runs names each run's tenant; the run's other
    # events name its tenant in a field, and a run id is one tenant's (checked below).
    if b"tenant" in f and f[b"tenant"] != tenant.encode():
        return None
    needle = run_id.encode()
    kind = f[b"e"].decode()
    if kind in BATCHED and b"runs" in f:
        if needle in f[b"runs"]:
            for run in batched_runs(kind, f):
                if run.run_id == run_id and run.tenant == tenant:
                    return _event(kind, f, run.attempt, run)
        return None
    attempt: int | None = int(f[b"attempt"]) if b"attempt" in f else None
    if kind == "created" and b"runs" in f:
        if not any(rid == run_id and t == tenant for rid, t, _, _ in created_runs(f)):
            return None
    elif kind == "dispatched":
        for item in f[b"runs"].split(b","):
            rid, _, n = item.rpartition(b":")
            if rid == needle:
                attempt = int(n)
                break
        else:
            return None
    elif f.get(b"id") != needle:
        return None
    return _event(kind, f, attempt)


async def _from_postgres(
    dsn: str, tenant: str, run_id: str
) -> list[tuple[StreamId, str, RunEvent]]:
    """The archived events of a run; none if another tenant's events name it."""
    rows = await _archived(dsn, "run_id = %s", run_id)
    if any(r[8] is not None and r[8] != tenant for r in rows):
        return []
    return [(_row_id(r), str(r[2]), _row_event(r)) for r in rows]


async def _archived(dsn: str, condition: str, value: str) -> list[tuple[Any, ...]]:
    """Archived run_events rows matching `condition` (one %s), oldest first: id_ms, id_seq,
    kind, at_ms, attempt, reason, error, node, tenant, run_id.

    One connection per lookup: this is the rare path (history older than the capped log).
    """
    try:
        async with pg.connection(dsn) as conn:
            cur = await conn.execute(
                "SELECT id_ms, id_seq, kind, at_ms, attempt, reason, error, node, tenant, run_id"
                f" FROM run_events WHERE {condition} ORDER BY id_ms, id_seq",
                (value,),
            )
            return list(await cur.fetchall())
    except psycopg.Error as exc:  # pragma: no cover - pg.connection maps these
        raise PostgresUnavailable(f"cannot read archived history: {exc}") from exc


def _row_id(r: tuple[Any, ...]) -> StreamId:
    return int(str(r[0])), int(str(r[1]))


def _row_event(r: tuple[Any, ...]) -> RunEvent:
    return RunEvent(
        kind=str(r[2]),
        at_ms=int(str(r[3])),
        attempt=None if r[4] is None else int(str(r[4])),
        reason=None if r[5] is None else str(r[5]),
        error=None if r[6] is None else str(r[6]),
        node=None if r[7] is None else str(r[7]),
    )


def _schedule_events(entries: Any, prefix: bytes) -> list[tuple[StreamId, str, RunEvent]]:
    """(entry id, run id, event) of every run whose id starts with `prefix` in `entries`."""
    found: list[tuple[StreamId, str, RunEvent]] = []
    for entry_id, f in entries:
        kind = f[b"e"].decode()
        if kind == "dispatched":
            for item in f[b"runs"].split(b","):
                if item.startswith(prefix):
                    rid, _, n = item.rpartition(b":")
                    found.append((parse_id(entry_id), rid.decode(), _event(kind, f, int(n))))
        elif kind in BATCHED and b"runs" in f:
            for run in batched_runs(kind, f):
                if run.run_id.encode().startswith(prefix):
                    found.append(
                        (parse_id(entry_id), run.run_id, _event(kind, f, run.attempt, run))
                    )
        elif kind == "created" and b"runs" in f:
            # a schedule's runs asked for by hand (trigger, backfill)
            for rid, _, _, _ in created_runs(f):
                if rid.encode().startswith(prefix):
                    found.append((parse_id(entry_id), rid, _event(kind, f, 0)))
        elif f.get(b"id", b"").startswith(prefix):
            attempt = int(f[b"attempt"]) if b"attempt" in f else None
            found.append((parse_id(entry_id), f[b"id"].decode(), _event(kind, f, attempt)))
    return found


@dataclass(frozen=True, slots=True)
class ScheduleRun:
    """One run of a schedule as its shard's event log tells it."""

    run_id: str
    events: list[RunEvent]


async def schedule_history(store: Store, sid: str, created_ms: int) -> list[ScheduleRun]:
    """The runs of schedule `sid`, in order of fire time (manual runs last), each with its
    events oldest first: from the shard's event log, and from PostgreSQL too when a DSN
    is configured and the log no longer reaches back to the schedule's creation
    (`created_ms`). The caller has checked that the schedule is the tenant's: every run
    id starting with '<sid>@' is one of its own.

    Raises:
        TaskNotFound: the id is not one of this deployment's.
        RedisUnavailable: the event log cannot be read.
    """
    shard = store.locate(sid)
    try:
        entries: Any = await store.client.xrange(store.keys.events(shard))
    except (RedisError, OSError) as exc:
        raise RedisUnavailable(f"cannot read the event log: {exc}") from exc
    found = _schedule_events(entries, (sid + "@").encode())
    dsn = store.settings.postgres_dsn
    if dsn and (not entries or parse_id(entries[0][0])[0] > created_ms):
        try:
            rows = await _archived(dsn, "run_id LIKE %s", sid + "@%")
        except (PostgresUnavailable, ConfigError) as exc:
            log.warning("history_fallback_failed", schedule_id=sid, error=str(exc))
            rows = []
        if rows:
            newest = _row_id(rows[-1])
            archived = [(_row_id(r), str(r[9]), _row_event(r)) for r in rows]
            found = archived + [item for item in found if item[0] > newest]
    runs: dict[str, list[RunEvent]] = {}
    for _, run_id, event in found:
        runs.setdefault(run_id, []).append(event)

    def order(run_id: str) -> tuple[int, str]:
        suffix = run_id.rpartition("@")[2]
        return (int(suffix), "") if suffix.isdigit() else (1 << 62, suffix)

    return [ScheduleRun(rid, runs[rid]) for rid in sorted(runs, key=order)]
