"""Dead letters of a tenant: list, replay (back into the wheel, attempt reset), purge."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from timewheel.errors import RedisUnavailable, ValidationError
from timewheel.store.library import check
from timewheel.store.shard import Call, Store, clock_arg
from timewheel.tasks.creates import REFUSED, CapOf, refusal
from timewheel.types import SCAN_CURSOR_MAX, field_int, field_text


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


def _parse_cursor(cursor: str) -> tuple[int, str]:
    """The shard and the exclusive XRANGE start of '<shard>-<ms>-<seq>'; a ValidationError
    for anything a stream entry id cannot be (each part at most 2^64 - 1)."""
    try:
        shard_text, ms_text, seq_text = cursor.split("-")
        shard, ms, seq = int(shard_text), int(ms_text), int(seq_text)
        # the last id there can be has nothing after it: XRANGE refuses "(" before it
        if (
            min(shard, ms, seq) < 0
            or max(ms, seq) > SCAN_CURSOR_MAX
            or ms == seq == SCAN_CURSOR_MAX
        ):
            raise ValueError(cursor)
    except ValueError:
        raise ValidationError("cursor is not one this API gave out", field="cursor") from None
    return shard, f"({ms}-{seq}"


async def list_dead(
    store: Store, tenant: str, *, limit: int = 100, after: str | None = None
) -> tuple[list[DeadLetter], str | None]:
    """A page of the tenant's dead letters, oldest first, and the cursor of the next page.

    The cursor is '<shard>-<entry id>' of the last item; pass it as `after`.
    """
    shards = sorted(await store.tenant_shards(tenant))
    start_shard, start_id = shards[0], "-"
    if after:
        start_shard, start_id = _parse_cursor(after)
    out: list[DeadLetter] = []
    try:
        for shard in shards:
            if shard < start_shard:
                continue
            low = start_id if shard == start_shard else "-"
            entries: Any = await store.client.xrange(
                store.keys.dead(shard, tenant), min=low, max="+", count=limit - len(out)
            )
            for entry_id, fields in entries:
                out.append(
                    DeadLetter(
                        run_id=field_text(fields, "run_id") or "",
                        tenant=field_text(fields, "tenant") or "",
                        queue=field_text(fields, "queue") or "",
                        attempt=field_int(fields, "attempt") or 0,
                        reason=field_text(fields, "reason") or "",
                        error=field_text(fields, "error") or "",
                        dead_ms=field_int(fields, "dead_ms") or 0,
                        due_ms=field_int(fields, "due_ms") or 0,
                        payload_json=field_text(fields, "payload") or "",
                        entry_id=f"{shard}-{entry_id.decode()}",
                    )
                )
            if len(out) >= limit:
                return out, out[-1].entry_id
    except (RedisError, OSError) as exc:
        raise RedisUnavailable(f"cannot list dead letters: {exc}") from exc
    return out, None


def _replayed(run_id: str, shard: int) -> Any:
    def decode(reply: list[Any]) -> int:
        check(reply, run_id=run_id, action="replay")
        if int(reply[0]) == REFUSED:
            raise refusal(int(reply[1]), int(reply[2]), shard)
        return int(reply[1])

    return decode


def _purged(run_id: str) -> Any:
    def decode(reply: list[Any]) -> None:
        check(reply, run_id=run_id, action="purge")

    return decode


async def replay(store: Store, tenant: str, run_id: str, *, caps: CapOf | None = None) -> int:
    """Put a dead-lettered run back into the wheel, due now, attempt reset; returns due_ms.
    StorageFull (nothing changed) when the shard's node is near its memory ceiling;
    OverLimit (nothing changed) when the run counts and its shard holds the tenant's cap
    (`caps`: the Limiter's, timewheel/limits.py)."""
    shard = store.locate(run_id)
    await store.guard.check([shard])
    k = store.keys
    cap = caps(tenant, shard) if caps is not None else None
    call = Call(
        store.scripts.dead_replay,
        [k.dead(shard, tenant), k.events(shard)],
        [run_id, tenant, *store.shared(shard, None), "" if cap is None else cap],
        _replayed(run_id, shard),
    )
    return await store.run(call)


async def purge(store: Store, tenant: str, run_id: str) -> None:
    """Delete a dead-lettered run for good (its dead letter and its record)."""
    shard = store.locate(run_id)
    k = store.keys
    call = Call(
        store.scripts.dead_purge,
        [k.dead(shard, tenant), k.events(shard)],
        [run_id, tenant, clock_arg(None), store.settings.event_log_max],
        _purged(run_id),
    )
    await store.run(call)
