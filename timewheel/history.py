"""A run's history, read from its shard's event log (capped; the archiver keeps it all)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from timewheel import ids
from timewheel.engine import Engine
from timewheel.errors import RedisUnavailable, TaskNotFound


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


async def run_history(engine: Engine, tenant: str, run_id: str) -> list[RunEvent]:
    """Every event of `run_id` still in the event log, oldest first.

    Raises:
        TaskNotFound: the id is not one of this deployment's.
    """
    shard = ids.shard_of(run_id)
    if shard is None or shard >= engine.settings.shards:
        raise TaskNotFound(run_id)
    try:
        entries: Any = await engine.client.xrange(engine.keys.events(shard))
    except (RedisError, OSError) as exc:
        raise RedisUnavailable(f"cannot read the event log: {exc}") from exc
    needle = run_id.encode()
    out: list[RunEvent] = []
    for _, f in entries:
        # A dispatched event lists runs of several tenants and names none; the run's
        # other events name its tenant, and a run id is one tenant's (checked below).
        if b"tenant" in f and f[b"tenant"] != tenant.encode():
            continue
        kind = f[b"e"].decode()
        attempt: int | None = int(f[b"attempt"]) if b"attempt" in f else None
        if kind == "dispatched":
            for item in f[b"runs"].split(b","):
                rid, _, n = item.rpartition(b":")
                if rid == needle:
                    attempt = int(n)
                    break
            else:
                continue
        elif f.get(b"id") != needle:
            continue
        out.append(
            RunEvent(
                kind=kind,
                at_ms=int(f[b"at"]),
                attempt=attempt,
                reason=f[b"reason"].decode() if b"reason" in f else None,
                error=f[b"error"].decode() if b"error" in f else None,
                node=f[b"node"].decode() if f.get(b"node") else None,
            )
        )
    if not any(e.kind != "dispatched" for e in out):
        return []  # only dispatches left in the log: the tenant cannot be told, show none
    return out


@dataclass(frozen=True, slots=True)
class ScheduleRun:
    """One run of a schedule as its shard's event log tells it."""

    run_id: str
    events: list[RunEvent]


async def schedule_history(engine: Engine, sid: str) -> list[ScheduleRun]:
    """The runs of schedule `sid` still in its shard's event log, in order of fire time
    (manual runs last), each with its events oldest first. The caller has checked that
    the schedule is the tenant's: every run id starting with '<sid>@' is one of its own.

    Raises:
        TaskNotFound: the id is not one of this deployment's.
    """
    shard = ids.shard_of(sid)
    if shard is None or shard >= engine.settings.shards:
        raise TaskNotFound(sid)
    try:
        entries: Any = await engine.client.xrange(engine.keys.events(shard))
    except (RedisError, OSError) as exc:
        raise RedisUnavailable(f"cannot read the event log: {exc}") from exc
    prefix = (sid + "@").encode()
    runs: dict[str, list[RunEvent]] = {}
    for _, f in entries:
        kind = f[b"e"].decode()
        found: list[tuple[bytes, int | None]] = []
        if kind == "dispatched":
            for item in f[b"runs"].split(b","):
                if item.startswith(prefix):
                    rid, _, n = item.rpartition(b":")
                    found.append((rid, int(n)))
        elif f.get(b"id", b"").startswith(prefix):
            found.append((f[b"id"], int(f[b"attempt"]) if b"attempt" in f else None))
        for rid, attempt in found:
            runs.setdefault(rid.decode(), []).append(
                RunEvent(
                    kind=kind,
                    at_ms=int(f[b"at"]),
                    attempt=attempt,
                    reason=f[b"reason"].decode() if b"reason" in f else None,
                    error=f[b"error"].decode() if b"error" in f else None,
                    node=f[b"node"].decode() if f.get(b"node") else None,
                )
            )

    def order(run_id: str) -> tuple[int, str]:
        suffix = run_id.rpartition("@")[2]
        return (int(suffix), "") if suffix.isdigit() else (1 << 62, suffix)

    return [ScheduleRun(rid, runs[rid]) for rid in sorted(runs, key=order)]
