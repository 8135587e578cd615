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
