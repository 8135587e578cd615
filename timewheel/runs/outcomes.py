"""Executor-side operations of the Engine: ack, fail, lease heartbeat, consumer groups.

Where a run goes when its executor is done: `ack` (lua/run_ack.lua) marks it succeeded;
`fail` (lua/run_fail.lua) puts it back into the wheel after backoff or into the dead letters.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError, ResponseError

from timewheel.config import Settings
from timewheel.errors import RedisUnavailable
from timewheel.models import Delivery
from timewheel.store.connection import RedisClient
from timewheel.store.keys import Keys
from timewheel.store.library import Script, ScriptArg, Scripts, check

if TYPE_CHECKING:
    from timewheel.store.pipeline import ScriptCall


@dataclass(frozen=True, slots=True)
class FailResult:
    """What a failed attempt led to: a retry at due_ms, a dead letter, or nothing (stale)."""

    outcome: str
    """retry | dead | stale"""
    due_ms: int | None = None
    dead_entry: str | None = None


def _arg(value: int | None) -> ScriptArg:
    return "" if value is None else value


class OutcomeOps:
    """Mixed into Engine, which provides the connection, settings, keys and scripts."""

    client: RedisClient
    settings: Settings
    keys: Keys
    scripts: Scripts

    if TYPE_CHECKING:

        async def call(
            self, script: Script, keys: Sequence[str], args: Sequence[ScriptArg]
        ) -> Any: ...

        async def _pipeline(self, calls: list[ScriptCall]) -> list[Any]: ...

    def _ack_call(
        self, delivery: Delivery, group: str, now_ms: int | None
    ) -> tuple[Script, list[str], list[ScriptArg]]:
        shard = self.keys.shard_of_key(delivery.stream)
        s = self.settings
        args: list[ScriptArg] = [
            group,
            delivery.entry_id,
            delivery.run_id,
            delivery.attempt,
            s.bucket_ms,
            _arg(now_ms),
            s.event_log_max,
            self.keys.wake_channel(),
            shard,
        ]
        return self.scripts.run_ack, [delivery.stream, self.keys.events(shard)], args

    async def ack(self, delivery: Delivery, group: str, *, now_ms: int | None = None) -> bool:
        """Acknowledge a delivery: XACK + XDEL, state -> succeeded. False if it was stale."""
        reply = await self.call(*self._ack_call(delivery, group, now_ms))
        check(reply, run_id=delivery.run_id, action="ack")
        return int(reply[0]) == 1

    async def ack_many(self, deliveries: Sequence[Delivery], group: str) -> list[bool]:
        """Acknowledge many deliveries in one pipeline; each answer as `ack` gives it.

        A run whose record is gone (purged) counts as not acknowledged (False).
        """
        replies = await self._pipeline([self._ack_call(d, group, None) for d in deliveries])
        return [int(r[0]) == 1 for r in replies]

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
        shard = self.keys.shard_of_key(delivery.stream)
        s = self.settings
        reply = await self.call(
            self.scripts.run_fail,
            [delivery.stream, self.keys.events(shard)],
            [
                group,
                delivery.entry_id,
                delivery.run_id,
                delivery.attempt,
                error[:2000],
                "1" if permanent else "0",
                _arg(delay_ms),
                repr(random.random()),
                s.retry_defaults_json(),
                s.bucket_ms,
                _arg(now_ms),
                s.event_log_max,
                self.keys.wake_channel(),
                shard,
            ],
        )
        check(reply, run_id=delivery.run_id, action="fail")
        code = int(reply[0])
        if code == 1:
            return FailResult("retry", due_ms=int(reply[1]))
        if code == 2:
            return FailResult("dead", dead_entry=reply[1].decode())
        return FailResult("stale")

    async def extend_lease(self, delivery: Delivery, group: str, consumer: str) -> bool:
        """Reset the entry's idle time (XCLAIM JUSTID by its own consumer): a heartbeat.

        False if the entry is gone (the reaper took it, or it was acknowledged).
        """
        try:
            claimed = await self.client.xclaim(
                delivery.stream, group, consumer, 0, [delivery.entry_id], justid=True
            )
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"heartbeat failed: {exc}") from exc
        return bool(claimed)

    async def register_group(self, stream: str, group: str) -> None:
        """Create a consumer group on a ready stream (from its start) and let reapers see it."""
        shard = self.keys.shard_of_key(stream)
        try:
            try:
                await self.client.xgroup_create(stream, group, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
            await self.client.sadd(self.keys.groups(shard), f"{group}|{stream}")
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"cannot create group {group!r} on {stream}: {exc}") from exc
