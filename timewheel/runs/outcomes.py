"""What an executor reports about a run: ack, fail, lease extension, consumer groups.

Where a run goes when its executor is done: `ack` (lua/run_ack.lua) marks it succeeded;
`fail` (lua/run_fail.lua) puts it back into the wheel after backoff, or into the dead
letters.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from timewheel.errors import RedisUnavailable
from timewheel.runs.delivery import Delivery
from timewheel.store.connection import UNREACHABLE
from timewheel.store.library import ScriptArg, check
from timewheel.store.shard import Call, Store, clock_arg

MAX_ERROR_CHARS = 2000
"""The longest error text kept as last_error and in a dead letter."""

ACKED = 1
RETRIED, BURIED = 1, 2
"""run_ack.lua's and run_fail.lua's codes (0: the delivery was stale)."""


@dataclass(frozen=True, slots=True)
class FailResult:
    """What a failed attempt led to: a retry at due_ms, a dead letter, or nothing (stale)."""

    outcome: str
    """retry | dead | stale"""
    due_ms: int | None = None
    dead_entry: str | None = None


def _acked(run_id: str) -> Any:
    def decode(reply: list[Any]) -> bool:
        check(reply, run_id=run_id, action="ack")
        return int(reply[0]) == ACKED

    return decode


def _ack_answer(reply: list[Any]) -> bool:
    """An ack's answer in a batch: a run whose record is gone (purged) is not acknowledged."""
    return int(reply[0]) == ACKED


def _failed(run_id: str) -> Any:
    def decode(reply: list[Any]) -> FailResult:
        check(reply, run_id=run_id, action="fail")
        code = int(reply[0])
        if code == RETRIED:
            return FailResult("retry", due_ms=int(reply[1]))
        if code == BURIED:
            return FailResult("dead", dead_entry=reply[1].decode())
        return FailResult("stale")

    return decode


class Outcomes:
    """The executor-side calls of one deployment."""

    def __init__(self, store: Store):
        self.store = store
        self._ack_parts: dict[str, tuple[list[str], list[ScriptArg]]] = {}
        """Per stream: an ack's KEYS and its trailing ARGV (the same for every ack)."""

    def ack_call(self, delivery: Delivery, group: str, now_ms: int | None = None) -> Call[bool]:
        k = self.store.keys
        shard = k.shard_of_key(delivery.stream)
        return Call(
            self.store.scripts.run_ack,
            [delivery.stream, k.events(shard)],
            [
                group,
                delivery.entry_id,
                delivery.run_id,
                delivery.attempt,
                *self.store.shared(shard, now_ms),
            ],
            _acked(delivery.run_id),
        )

    async def ack(self, delivery: Delivery, group: str, *, now_ms: int | None = None) -> bool:
        """Acknowledge a delivery: XACK + XDEL, state -> succeeded. False if it was stale."""
        return await self.store.run(self.ack_call(delivery, group, now_ms))

    def ack_parts(self, stream: str) -> tuple[list[str], list[ScriptArg]]:
        """An ack's KEYS and its trailing ARGV on a stream: the same for every ack there."""
        parts = self._ack_parts.get(stream)
        if parts is None:
            k = self.store.keys
            shard = k.shard_of_key(stream)
            parts = ([stream, k.events(shard)], self.store.shared(shard, None))
            self._ack_parts[stream] = parts
        return parts

    async def ack_many(self, deliveries: Sequence[Delivery], group: str) -> list[bool]:
        """Acknowledge many deliveries in one pipeline; each answer as `ack` gives it.

        A run whose record is gone (purged) counts as not acknowledged (False). The calls
        are the ones `ack_call` builds, their KEYS and trailing ARGV kept per stream (a
        worker acks tens of thousands of runs a second).
        """
        script, parts = self.store.scripts.run_ack, self.ack_parts
        calls: list[Call[bool]] = []
        for d in deliveries:
            keys, tail = parts(d.stream)
            args: list[ScriptArg] = [group, d.entry_id, d.run_id, d.attempt, *tail]
            calls.append(Call(script, keys, args, _ack_answer))
        replies = await self.store.send(calls)
        return [int(r[0]) == ACKED for r in replies]

    async def fail(
        self,
        delivery: Delivery,
        group: str,
        error: str,
        *,
        permanent: bool = False,
        delay_ms: int | None = None,
        now_ms: int | None = None,
    ) -> FailResult:
        """An attempt failed: retry after backoff (or `delay_ms`), or dead-letter.

        Args:
            delivery: the stream entry the executor got.
            group: its consumer group.
            error: what went wrong, kept as last_error and in the dead letter.
            permanent: dead-letter at once, whatever attempts remain.
            delay_ms: wait this long instead of the policy's backoff (Retry-After).
        """
        k, s = self.store.keys, self.store.settings
        shard = k.shard_of_key(delivery.stream)
        call = Call(
            self.store.scripts.run_fail,
            [delivery.stream, k.events(shard)],
            [
                group,
                delivery.entry_id,
                delivery.run_id,
                delivery.attempt,
                error[:MAX_ERROR_CHARS],
                "1" if permanent else "0",
                clock_arg(delay_ms),
                repr(random.random()),
                s.retry_defaults_json(),
                *self.store.shared(shard, now_ms),
            ],
            _failed(delivery.run_id),
        )
        return await self.store.run(call)

    async def extend_lease(self, delivery: Delivery, group: str, consumer: str) -> bool:
        """Reset the entry's idle time (XCLAIM JUSTID by its own consumer), so the reaper
        leaves it alone. False if the entry is gone (reaped, or acknowledged)."""
        try:
            claimed = await self.store.client.xclaim(
                delivery.stream, group, consumer, 0, [delivery.entry_id], justid=True
            )
        except UNREACHABLE as exc:
            raise RedisUnavailable(f"lease extension failed: {exc}") from exc
        return bool(claimed)

    async def register_group(self, stream: str, group: str) -> None:
        """Create a consumer group on a ready stream (from its start) and let reapers see it."""
        shard = self.store.keys.shard_of_key(stream)
        client = self.store.client
        try:
            try:
                await client.xgroup_create(stream, group, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
            await client.sadd(self.store.keys.groups(shard), f"{group}|{stream}")
        except UNREACHABLE as exc:
            raise RedisUnavailable(f"cannot create group {group!r} on {stream}: {exc}") from exc
