"""Dead letters of a tenant: list, replay (back into the wheel, attempt reset), purge."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from timewheel import ids
from timewheel.engine import Engine
from timewheel.errors import RedisUnavailable, TaskNotFound
from timewheel.store.library import check


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A run that exhausted its attempts, failed permanently, or expired before dispatch."""

    run_id: str
    tenant: str
    queue: str
    attempt: int
    reason: str
    """failed | lease_expired | expired"""
    error: str
    dead_ms: int
    due_ms: int
    payload_json: str
    entry_id: str


def _text(fields: dict[bytes, bytes], name: str) -> str:
    return fields.get(name.encode(), b"").decode()


async def list_dead(
    engine: Engine, tenant: str, *, limit: int = 100, after: str | None = None
) -> tuple[list[DeadLetter], str | None]:
    """A page of the tenant's dead letters, oldest first, and the cursor of the next page.

    The cursor is '<shard>-<entry id>' of the last item; pass it as `after`.
    """
    shards = sorted(engine.shards_of(tenant))
    start_shard, start_id = shards[0], "-"
    if after:
        shard_text, _, entry = after.partition("-")
        start_shard, start_id = int(shard_text), f"({entry}"
    out: list[DeadLetter] = []
    try:
        for shard in shards:
            if shard < start_shard:
                continue
            low = start_id if shard == start_shard else "-"
            entries: Any = await engine.client.xrange(
                engine.keys.dead(shard, tenant), min=low, max="+", count=limit - len(out)
            )
            for entry_id, fields in entries:
                out.append(
                    DeadLetter(
                        run_id=_text(fields, "run_id"),
                        tenant=_text(fields, "tenant"),
                        queue=_text(fields, "queue"),
                        attempt=int(_text(fields, "attempt") or 0),
                        reason=_text(fields, "reason"),
                        error=_text(fields, "error"),
                        dead_ms=int(_text(fields, "dead_ms") or 0),
                        due_ms=int(_text(fields, "due_ms") or 0),
                        payload_json=_text(fields, "payload"),
                        entry_id=f"{shard}-{entry_id.decode()}",
                    )
                )
            if len(out) >= limit:
                return out, out[-1].entry_id
    except (RedisError, OSError) as exc:
        raise RedisUnavailable(f"cannot list dead letters: {exc}") from exc
    return out, None


def _shard(engine: Engine, run_id: str) -> int:
    shard = ids.shard_of(run_id)
    if shard is None or shard >= engine.settings.shards:
        raise TaskNotFound(run_id)
    return shard


async def replay(engine: Engine, tenant: str, run_id: str) -> int:
    """Put a dead-lettered run back into the wheel, due now, attempt reset; returns due_ms."""
    shard = _shard(engine, run_id)
    k, s = engine.keys, engine.settings
    reply = await engine.call(
        engine.scripts.dead_replay,
        [k.dead(shard, tenant), k.events(shard)],
        [run_id, tenant, s.bucket_ms, "", s.event_log_max, k.wake_channel(), shard],
    )
    check(reply, run_id=run_id, action="replay")
    return int(reply[1])


async def purge(engine: Engine, tenant: str, run_id: str) -> None:
    """Delete a dead-lettered run for good (its dead letter and its record)."""
    shard = _shard(engine, run_id)
    k = engine.keys
    reply = await engine.call(
        engine.scripts.dead_purge,
        [k.dead(shard, tenant), k.events(shard)],
        [run_id, tenant, "", engine.settings.event_log_max],
    )
    check(reply, run_id=run_id, action="purge")
