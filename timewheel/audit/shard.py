"""The audit of one shard: its phases, in order, each a run of bounded Lua calls continued
by a cursor this object holds, so `step(budget)` can stop anywhere and go on later.

Phases (docs/operations/auditing.md has what each checks):

1. view: the shard clock, promoted_until, the lease, how much is due (audit_shard).
2. records: every record of the 1,024 body hashes (audit_records). A run found out
   (dispatched) goes to the pass's scratch hash in the shard. With AuditOptions.events
   it also counts what each tenant's usage hash should hold, the schedules too, and ends
   with the usage check (events.py).
3. streams: every ready stream's entries (audit_stream), which take their runs off the
   scratch hash.
4. confirm: what is left in the scratch hash (audit_confirm): out, and no entry.
5. near, far: the members of every near level and far bucket (audit_near, audit_far).
6. schedules: every schedule (audit_schedules).
7. events, with AuditOptions.events: the newest entries of the event log against the
   records of the runs they name (events.py).

The shard's near levels, far buckets and streams are those the pass found by SCAN
(keyspace.py) before it began.

The order keeps the scratch hash short-lived (it exists from the records to the confirm
phase) and makes the check of dispatched runs exact under load: a run seen out in the
records phase, and still out at the same attempt in the confirm phase, had its entry in
the stream all along if it had one, since every script that deletes an entry changes the
run's record in the same call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any

from timewheel.audit.calls import (
    BODY_HASHES,
    MAX_KEYS_PER_CALL,
    RECORDS_DONE_USAGE,
    AuditCalls,
    ShardView,
    Step,
)
from timewheel.audit.events import EventCheck, usage_field, usage_findings, usage_mark
from timewheel.audit.findings import Finding, Kind
from timewheel.audit.keyspace import ShardKeys
from timewheel.schedules.model import spec_from_json
from timewheel.schedules.spec import next_fire
from timewheel.store.shard import Store


class Phase(StrEnum):
    VIEW = "view"
    RECORDS = "records"
    STREAMS = "streams"
    CONFIRM = "confirm"
    NEAR = "near"
    FAR = "far"
    SCHEDULES = "schedules"
    EVENTS = "events"
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
    """Near-level and far-bucket members checked."""
    members_read: int = 0
    """Of them, those read one by one: in a level or bucket that held more (or fewer)
    members than the records phase found runs in it."""
    schedules: int = 0
    events: int = 0
    """Runs of the event logs judged against their records (--events)."""
    archived: int = 0
    """Open runs of the archive checked against Redis (--archive)."""
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


class ShardAudit:
    """One shard's part of an audit pass."""

    def __init__(
        self,
        calls: AuditCalls,
        shard: int,
        pass_id: str,
        keys: ShardKeys,
        sink: Sink,
        live: frozenset[str] | None = None,
    ):
        self.calls = calls
        self.live = live
        """The live scheduler nodes, when the caller knows them (the continuous auditor):
        then a shard without a live lease holder is a finding."""
        self.store: Store = calls.store
        self.shard = shard
        self.sink = sink
        self.scratch = self.store.keys.audit_scratch(shard, pass_id)
        self.phase = Phase.VIEW
        self.view: ShardView | None = None
        self.examined = Examined()
        self._at = _Cursor()
        self._near = keys.near
        self._buckets = keys.buckets
        self._streams = keys.streams
        self._events: EventCheck | None = None
        self._usage_tenants = keys.usage
        self._usage_from: str | None = None
        """The shard's last event-log entry when the records phase began (usage check)."""
        self._usage: dict[str, dict[str, int]] = {}
        """tenant -> usage field -> its count as the records phase found it."""
        self._placed: dict[str, int] = {}
        """Near level or far bucket -> the scheduled runs the records phase found in it."""

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
        if self.phase is Phase.EVENTS and not self.calls.options.events:
            self.phase = Phase.DONE
        if self.phase is Phase.SCHEDULES:
            self._placed = {}  # the near and far phases are done with it
        # A stream is read from its start when the cursor is '' (audit_stream).
        self._at = _Cursor(cursor="" if self.phase is Phase.STREAMS else "0")

    async def _call(self) -> int:
        phase = self.phase
        if phase is Phase.VIEW:
            self.view = await self.store.run(self.calls.shard(self.shard))
            await self._check_owner(self.view)
            self._next_phase()
            return 1
        if phase is Phase.RECORDS:
            return await self._records()
        if phase is Phase.STREAMS:
            return await self._keys_step(self._streams, self._streams_call, entries=True)
        if phase is Phase.CONFIRM:
            return await self._confirm_step()
        if phase is Phase.NEAR:
            return await self._keys_step(self._near, self._near_call)
        if phase is Phase.FAR:
            return await self._keys_step(self._buckets, self._far_call)
        if phase is Phase.SCHEDULES:
            return await self._schedules_step()
        if phase is Phase.EVENTS:
            return await self._events_step()
        return 0

    async def _events_step(self) -> int:
        if self._events is None:
            self._events = EventCheck(self.store, self.shard, self.calls.options.batch)
        read, findings = await self._events.step()
        for finding in findings:
            await self.sink(finding)
        if self._events.done:
            self.examined.events += self._events.examined
            self._events = None
            self._next_phase()
        return read

    async def _check_owner(self, view: ShardView) -> None:
        """shard_unowned, when the caller knows the live nodes (a pass run by hand has no
        fleet to compare with: single-process and unfenced deployments hold no leases):
        no lease, or one whose node is not alive."""
        if self.live is None:
            return
        if not view.lease:
            detail = "no scheduler node holds the shard's lease"
        elif view.lease.rpartition("/")[0] not in self.live:
            detail = f"its lease names {view.lease}, which is not among the live nodes"
        else:
            return
        await self.sink(Finding(Kind.SHARD_UNOWNED, self.shard, "", "", detail, "unowned"))

    async def _records(self) -> int:
        at = self._at
        counts = self.calls.options.events
        if counts and self._usage_from is None:
            self._usage_from = await usage_mark(self.store, self.shard)
        reading_records = at.index < BODY_HASHES
        call = self.calls.records(self.shard, self.scratch, at.index, at.cursor, self.backlog)
        step = await self.store.run(call)
        await self._found_all(step)
        for key, n in (step.placed or {}).items():
            usage = usage_field(key)
            if usage is not None:
                fields = self._usage.setdefault(usage[0], {})
                fields[usage[1]] = fields.get(usage[1], 0) + n
            else:
                self._placed[key] = self._placed.get(key, 0) + n
        if reading_records:  # past them, the schedules: counted by the schedules phase
            self.examined.records += step.examined
        at.index, at.cursor = step.position, step.cursor
        if at.index >= (RECORDS_DONE_USAGE if counts else BODY_HASHES):
            if counts and self._usage_from is not None:
                tenants = sorted(set(self._usage_tenants) | set(self._usage))
                for finding in await usage_findings(
                    self.store, self.shard, self._usage_from, tenants, self._usage
                ):
                    await self.sink(finding)
            self._usage = {}
            self._next_phase()
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

    def _streams_call(self, shard: int, streams: list[str], cursor: str) -> Any:
        return self.calls.streams(shard, self.scratch, streams, cursor)

    def _near_call(self, shard: int, keys: list[str], cursor: str) -> Any:
        return self.calls.near(shard, keys, cursor, [self._placed.get(k, 0) for k in keys])

    def _far_call(self, shard: int, keys: list[str], cursor: str) -> Any:
        return self.calls.far(shard, keys, cursor, [self._placed.get(k, 0) for k in keys])

    async def _keys_step(
        self, names: list[str], build: Callable[..., Any], *, entries: bool = False
    ) -> int:
        """A streams, near or far phase: the keys from the current one on,
        MAX_KEYS_PER_CALL a call."""
        at = self._at
        if at.index >= len(names):
            self._next_phase()
            return 0
        chunk = names[at.index : at.index + MAX_KEYS_PER_CALL]
        step: Step = await self.store.run(build(self.shard, chunk, at.cursor))
        await self._found_all(step)
        if entries:
            self.examined.entries += step.examined
        else:
            self.examined.members += step.examined + step.counted
            self.examined.members_read += step.examined
        at.index += step.position
        at.cursor = step.cursor
        return step.examined + step.position

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
