"""The audit of one shard: its phases, in order, each a run of bounded Lua calls continued
by a cursor this object holds, so `step(budget)` can stop anywhere and go on later.

Phases (docs/operations/auditing.md has what each checks):

1. view: the shard clock, promoted_until, the lease, how much is due (audit_shard).
2. keys: the shard's near levels, far buckets and ready streams, by SCAN on the node
   holding the shard (key names only; COUNT 1000 a step).
3. records: every record of the 1,024 body hashes (audit_records). A run found out
   (dispatched) goes to the pass's scratch hash in the shard.
4. streams: every ready stream's entries (audit_stream), which take their runs off the
   scratch hash.
5. confirm: what is left in the scratch hash (audit_confirm): out, and no entry.
6. near, far: the members of every near level and far bucket (audit_near, audit_far).
7. schedules: every schedule (audit_schedules).

The order keeps the scratch hash short-lived (it exists from the records to the confirm
phase) and makes the check of dispatched runs exact under load: a run seen out in the
records phase, and still out at the same attempt in the confirm phase, had its entry in
the stream all along if it had one, since every script that deletes an entry changes the
run's record in the same call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from timewheel.audit.calls import BODY_HASHES, MAX_KEYS_PER_CALL, AuditCalls, ShardView, Step
from timewheel.audit.findings import Finding, Kind
from timewheel.errors import RedisUnavailable
from timewheel.schedules.model import spec_from_json
from timewheel.schedules.spec import next_fire
from timewheel.store.shard import Store
from timewheel.types import text

SCAN_COUNT = 1000
"""Keys SCAN looks at per step of the keys phase."""


class Phase(StrEnum):
    VIEW = "view"
    KEYS = "keys"
    RECORDS = "records"
    STREAMS = "streams"
    CONFIRM = "confirm"
    NEAR = "near"
    FAR = "far"
    SCHEDULES = "schedules"
    DONE = "done"


PHASES = list(Phase)

Sink = Callable[[Finding], Awaitable[None]]
"""Where findings go as they are found (the pass's tally, and its repairs)."""


@dataclass(slots=True)
class Examined:
    """What a shard's audit read, by what it is."""

    records: int = 0
    entries: int = 0
    """Ready-stream entries."""
    members: int = 0
    """Near-level and far-bucket members."""
    schedules: int = 0
    keys: int = 0
    """Key names SCAN returned."""
    calls: int = 0

    def add(self, other: Examined) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def to_json(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(slots=True)
class _Cursor:
    """Where a phase goes on: an index into a list (or the body hashes) and a cursor."""

    index: int = 0
    cursor: str = "0"
    started: bool = False


@dataclass(slots=True)
class _ShardKeys:
    near: set[str] = field(default_factory=set)
    buckets: set[str] = field(default_factory=set)
    streams: set[str] = field(default_factory=set)


class ShardAudit:
    """One shard's part of an audit pass."""

    def __init__(self, calls: AuditCalls, shard: int, pass_id: str, sink: Sink):
        self.calls = calls
        self.store: Store = calls.store
        self.shard = shard
        self.sink = sink
        self.scratch = self.store.keys.audit_scratch(shard, pass_id)
        self.phase = Phase.VIEW
        self.view: ShardView | None = None
        self.examined = Examined()
        self._at = _Cursor()
        self._found = _ShardKeys()
        self._near: list[str] = []
        self._buckets: list[str] = []
        self._streams: list[str] = []
        self._scan_node: Any = None

    @property
    def done(self) -> bool:
        return self.phase is Phase.DONE

    @property
    def backlog(self) -> bool:
        """Whether more was due in the shard, when the pass began, than a tick takes."""
        return self.view is not None and self.view.due_runs > self.store.settings.tick_batch

    async def step(self, budget: int) -> int:
        """Make calls until about `budget` things (records, entries, members, schedules,
        key names) are read or the shard is done; returns how many were read. Each call
        counts at least 1, so a step always moves on."""
        spent = 0
        while spent < budget and not self.done:
            spent += max(1, await self._call())
            self.examined.calls += 1
        return spent

    async def run(self) -> None:
        while not self.done:
            await self.step(1 << 30)

    # -- phases --------------------------------------------------------------------------

    def _next_phase(self) -> None:
        self.phase = PHASES[PHASES.index(self.phase) + 1]
        self._at = _Cursor()

    async def _call(self) -> int:
        phase = self.phase
        if phase is Phase.VIEW:
            self.view = await self.store.run(self.calls.shard(self.shard))
            self._next_phase()
            return 1
        if phase is Phase.KEYS:
            return await self._scan_keys()
        if phase is Phase.RECORDS:
            return await self._records()
        if phase is Phase.STREAMS:
            return await self._streams_step()
        if phase is Phase.CONFIRM:
            return await self._confirm_step()
        if phase is Phase.NEAR:
            return await self._keys_step(self._near, self.calls.near)
        if phase is Phase.FAR:
            return await self._keys_step(self._buckets, self.calls.far)
        if phase is Phase.SCHEDULES:
            return await self._schedules_step()
        return 0

    async def _scan_keys(self) -> int:
        k = self.store.keys
        tag = k.tag(self.shard)
        pattern = _glob_escape(tag) + "[nwq]*"
        client = self.store.client
        try:
            if isinstance(client, RedisCluster):
                if self._scan_node is None:
                    self._scan_node = client.get_node_from_key(k.meta(self.shard))
                reply: Any = await client.scan(
                    cursor=int(self._at.cursor),
                    match=pattern,
                    count=SCAN_COUNT,
                    target_nodes=self._scan_node,
                )
                cursors, names = reply  # {node name: cursor}, keys
                cursor = int(next(iter(cursors.values()))) if cursors else 0
            else:
                cursor, names = await client.scan(
                    cursor=int(self._at.cursor), match=pattern, count=SCAN_COUNT
                )
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"SCAN of shard {self.shard} failed: {exc}") from exc
        for raw in names:
            name = text(raw)
            rest = name[len(tag) :]
            if rest.startswith("near:"):
                self._found.near.add(name)
            elif rest.startswith("w:"):
                self._found.buckets.add(name)
            elif rest.startswith("q:"):
                self._found.streams.add(name)
        self.examined.keys += len(names)
        if int(cursor) == 0:
            self._near = sorted(self._found.near)
            self._buckets = sorted(self._found.buckets)
            self._streams = sorted(self._found.streams)
            self._found = _ShardKeys()
            self._next_phase()
        else:
            self._at.cursor = str(cursor)
        return max(1, len(names))

    async def _records(self) -> int:
        at = self._at
        call = self.calls.records(self.shard, self.scratch, at.index, at.cursor, self.backlog)
        step = await self.store.run(call)
        await self._found_all(step)
        self.examined.records += step.examined
        at.index, at.cursor = step.position, step.cursor
        if at.index >= BODY_HASHES:
            self._next_phase()
        return step.examined

    async def _streams_step(self) -> int:
        at = self._at
        if at.index >= len(self._streams):
            self._next_phase()
            return 0
        after = at.cursor if at.started else ""
        step = await self.store.run(
            self.calls.stream(self.shard, self.scratch, self._streams[at.index], after)
        )
        await self._found_all(step)
        self.examined.entries += step.examined
        if step.cursor == "":
            at.index, at.cursor, at.started = at.index + 1, "0", False
        else:
            at.cursor, at.started = step.cursor, True
        return step.examined

    async def _confirm_step(self) -> int:
        """One HSCAN step of the scratch hash."""
        at = self._at
        step = await self.store.run(self.calls.confirm(self.shard, self.scratch, at.cursor))
        await self._found_all(step)
        if step.cursor == "0":
            self._next_phase()
        else:
            at.cursor = step.cursor
        return step.examined

    async def _keys_step(self, names: list[str], build: Callable[..., Any]) -> int:
        """A near or far phase: the keys from the current one on, MAX_KEYS_PER_CALL a call."""
        at = self._at
        if at.index >= len(names):
            self._next_phase()
            return 0
        chunk = names[at.index : at.index + MAX_KEYS_PER_CALL]
        step: Step = await self.store.run(build(self.shard, chunk, at.cursor))
        await self._found_all(step)
        self.examined.members += step.examined
        at.index += step.position
        at.cursor = step.cursor
        return step.examined

    async def _schedules_step(self) -> int:
        at = self._at
        step = await self.store.run(self.calls.schedules(self.shard, at.cursor))
        for found in step.findings:
            finding = (
                await _ended_silently(found)
                if found.kind is Kind.SCHEDULE_ENDED_SILENTLY
                else found
            )
            if finding is not None:
                await self.sink(finding)
        self.examined.schedules += step.examined
        if step.cursor == "0":
            self._next_phase()
        else:
            at.cursor = step.cursor
        return step.examined

    async def _found_all(self, step: Step) -> None:
        for finding in step.findings:
            await self.sink(finding)


async def _ended_silently(candidate: Finding) -> Finding | None:
    """An ended schedule audit_schedules could not explain (detail: its spec JSON, data:
    its cursor): a finding if its spec still has a fire time after the cursor."""
    try:
        spec = spec_from_json(candidate.detail)
        cursor = int(candidate.data)
    except (ValueError, KeyError, TypeError) as exc:
        return Finding(
            candidate.kind,
            candidate.shard,
            candidate.tenant,
            candidate.id,
            f"ended, and its stored spec or cursor does not read: {exc}",
        )
    # Fire times are a tenant's cron: computed off the event loop, as the planner does.
    following = await asyncio.to_thread(next_fire, spec, cursor)
    if following is None:
        return None  # its spec has no fire time left: that ended it
    return Finding(
        candidate.kind,
        candidate.shard,
        candidate.tenant,
        candidate.id,
        f"ended after {cursor} though its spec fires again at {following}, with neither "
        "end_at nor max_runs reached",
    )


def _glob_escape(value: str) -> str:
    """A literal for a SCAN MATCH pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in value)
