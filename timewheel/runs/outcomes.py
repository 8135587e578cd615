"""What an executor reports about a run: ack, fail, lease extension, consumer groups.

Where a run goes when its executor is done: `ack` (lua/run_ack.lua) marks it succeeded;
`fail` (lua/run_fail.lua) puts it back into the wheel after backoff, or into the dead
letters. Both scripts take many runs of one shard in one call (`ack_many`, `fail_many`:
one call per shard), and a single run is a call of one.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
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


REPORTS_PER_CALL = 256
"""Runs one run_ack or run_fail call reports at most (a worker's batch is smaller)."""


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed attempt to report: the delivery and what `Outcomes.fail` takes."""

    delivery: Delivery
    error: str
    permanent: bool = False
    delay_ms: int | None = None


def _fail_result(reply: list[Any]) -> FailResult:
    code = int(reply[0])
    if code == RETRIED:
        return FailResult("retry", due_ms=int(reply[1]))
    if code == BURIED:
        return FailResult("dead", dead_entry=reply[1].decode())
    return FailResult("stale")


def _one_ack(run_id: str) -> Any:
    def decode(reply: list[Any]) -> bool:
        check([reply[0]], run_id=run_id, action="ack")
        return int(reply[0]) == ACKED

    return decode


def _one_fail(run_id: str) -> Any:
    def decode(reply: list[Any]) -> FailResult:
        check(reply, run_id=run_id, action="fail")
        return _fail_result(reply)

    return decode


def _ack_codes(reply: list[Any]) -> list[bool]:
    """A batched ack's answers: a run whose record is gone (purged) is not acknowledged."""
    return [int(code) == ACKED for code in reply]


def _fail_results(reply: list[Any]) -> list[FailResult]:
    """A batched fail's answers, from its flat reply (code and detail of each run in
    turn): a run whose record is gone counts as stale."""
    return [
        _fail_result(reply[i : i + 2]) if int(reply[i]) >= 0 else FailResult("stale")
        for i in range(0, len(reply), 2)
    ]


def by_shard(
    deliveries: Sequence[Delivery], shard_of: Callable[[str], int], limit: int = REPORTS_PER_CALL
) -> list[tuple[int, list[int]]]:
    """The positions of `deliveries` grouped by shard (in order within each), at most
    `limit` per group: each group is one call."""
    groups: dict[int, list[int]] = {}
    out: list[tuple[int, list[int]]] = []
    for i, d in enumerate(deliveries):
        shard = shard_of(d.stream)
        group = groups.get(shard)
        if group is None or len(group) >= limit:
            group = groups[shard] = []
            out.append((shard, group))
        group.append(i)
    return out


def report_keys(
    events: str, deliveries: Sequence[Delivery], positions: Sequence[int]
) -> tuple[list[str], list[int]]:
    """The KEYS of one batched report (the event log, then each stream once) and each
    delivery's stream index among them (1 = KEYS[2])."""
    keys, where = [events], []
    index: dict[str, int] = {}
    for i in positions:
        stream = deliveries[i].stream
        n = index.get(stream)
        if n is None:
            keys.append(stream)
            n = index[stream] = len(keys) - 1
        where.append(n)
    return keys, where


class Outcomes:
    """The executor-side calls of one deployment."""

    def __init__(self, store: Store):
        self.store = store

    def ack_call(
        self, deliveries: Sequence[Delivery], group: str, now_ms: int | None = None
    ) -> Call[list[bool]]:
        """One run_ack call for deliveries of one shard (each answered as `ack_many` does)."""
        k = self.store.keys
        shard = k.shard_of_key(deliveries[0].stream)
        keys, where = report_keys(k.events(shard), deliveries, range(len(deliveries)))
        args: list[ScriptArg] = [group, *self.store.shared(shard, now_ms)]
        for d, n in zip(deliveries, where, strict=True):
            args += [n, d.entry_id, d.run_id, d.attempt]
        return Call(self.store.scripts.run_ack, keys, args, _ack_codes)

    async def ack(self, delivery: Delivery, group: str, *, now_ms: int | None = None) -> bool:
        """Acknowledge a delivery: XACK + XDEL, state -> succeeded. False if it was stale.

        Raises:
            TaskNotFound: the run has no record (purged).
        """
        call = self.ack_call([delivery], group, now_ms)
        return await self.store.run(
            Call(call.script, call.keys, call.args, _one_ack(delivery.run_id))
        )

    async def ack_many(
        self, deliveries: Sequence[Delivery], group: str, *, now_ms: int | None = None
    ) -> list[bool]:
        """Acknowledge many deliveries, one run_ack call per shard, all in one pipeline;
        each answer as `ack` gives it, and a run whose record is gone (purged) counts as
        not acknowledged (False)."""
        shard_of = self.store.keys.shard_of_key
        groups = by_shard(deliveries, shard_of)
        calls = [self.ack_call([deliveries[i] for i in pos], group, now_ms) for _, pos in groups]
        replies = await self.store.send(calls)
        answers = [False] * len(deliveries)
        for (_, positions), reply in zip(groups, replies, strict=True):
            for i, answer in zip(positions, _ack_codes(reply), strict=True):
                answers[i] = answer
        return answers

    def fail_call(
        self, failures: Sequence[Failure], group: str, now_ms: int | None = None
    ) -> Call[list[FailResult]]:
        """One run_fail call for failed attempts of one shard."""
        k, s = self.store.keys, self.store.settings
        shard = k.shard_of_key(failures[0].delivery.stream)
        deliveries = [f.delivery for f in failures]
        keys, where = report_keys(k.events(shard), deliveries, range(len(deliveries)))
        args: list[ScriptArg] = [
            group,
            s.retry_defaults_json(),
            *self.store.shared(shard, now_ms),
            repr(random.random()),
        ]
        for f, n in zip(failures, where, strict=True):
            d = f.delivery
            args += [
                n,
                d.entry_id,
                d.run_id,
                d.attempt,
                f.error[:MAX_ERROR_CHARS],
                "1" if f.permanent else "0",
                clock_arg(f.delay_ms),
            ]
        return Call(self.store.scripts.run_fail, keys, args, _fail_results)

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

        Raises:
            TaskNotFound: the run has no record (purged).
        """
        call = self.fail_call([Failure(delivery, error, permanent, delay_ms)], group, now_ms)
        return await self.store.run(
            Call(call.script, call.keys, call.args, _one_fail(delivery.run_id))
        )

    async def fail_many(
        self, failures: Sequence[Failure], group: str, *, now_ms: int | None = None
    ) -> list[FailResult]:
        """Report many failed attempts, one run_fail call per shard, all in one pipeline;
        each answer as `fail` gives it, and a run whose record is gone counts as stale."""
        shard_of = self.store.keys.shard_of_key
        deliveries = [f.delivery for f in failures]
        groups = by_shard(deliveries, shard_of)
        calls = [self.fail_call([failures[i] for i in pos], group, now_ms) for _, pos in groups]
        replies = await self.store.send(calls)
        results = [FailResult("stale")] * len(failures)
        for (_, positions), reply in zip(groups, replies, strict=True):
            for i, result in zip(positions, _fail_results(reply), strict=True):
                results[i] = result
        return results

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
