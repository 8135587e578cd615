"""Operations on recurring schedules: create, get, update, pause, resume, delete,
trigger and backfill, each one Lua call on the schedule's shard.

Where a schedule goes: `create` stores it in its shard (tag..'s:'..sid) and
materializes its first runs up to the plan horizon (lua/schedule_create.lua); the
planner (timewheel/schedules/planner.py, run by the scheduler node holding the shard)
extends every active schedule as its horizon moves (lua/schedule_materialize.lua); the
tick sends its runs like any other, after the catchup and overlap checks of
lua/lib/schedule.lua. Fire times are computed in Python (timewheel/schedules/spec.py);
every move happens in Lua.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from redis.exceptions import RedisError

from timewheel import ids
from timewheel.errors import RedisUnavailable, ScriptError, TaskNotFound, ValidationError
from timewheel.schedules.model import (
    NewSchedule,
    Schedule,
    ScheduleChanges,
    jittered,
    spec_from_json,
    spec_json,
)
from timewheel.schedules.spec import ScheduleSpec, fire_times, plan_fires
from timewheel.store.library import ScriptArg, check
from timewheel.store.shard import Call, Store, clock_arg
from timewheel.tasks.creates import REFUSED, CapOf, refusal
from timewheel.tasks.ops import TaskOps
from timewheel.types import text

MAX_BACKFILL = 1000
"""Most fire times one backfill call materializes."""
UPDATE_TRIES = 5
"""How often update reads again when the schedule changed under it."""
MAX_FIRES_PER_CALL = 1000
"""Most fire times one create, update or materialize call plans (bounds the call)."""

Admit = Callable[[Schedule, int], Awaitable[None]]
"""Asked before trigger or backfill writes: the schedule and how many runs it would add;
raising refuses them (a tenant's limits, say)."""


def fires_arg(fires: Sequence[int]) -> str:
    """Fire times as the schedule scripts take them: ascending, comma-separated."""
    return ",".join(map(str, fires))


def planning_args(store: Store, shard: int, now_ms: int | None) -> list[ScriptArg]:
    """The trailing arguments of the scripts that place planned runs (schedule_create,
    schedule_update, schedule_materialize): bucket width, misfire threshold, clock
    override, event log cap, wake channel, shard."""
    s = store.settings
    return [
        s.bucket_ms,
        s.misfire_ms,
        clock_arg(now_ms),
        s.event_log_max,
        store.keys.wake_channel(),
        shard,
    ]


def _checked(sid: str, action: str) -> Any:
    """The decoder of a schedule script whose negative codes name the schedule."""

    def decode(reply: list[Any]) -> list[Any]:
        return check(reply, run_id=sid, action=action)

    return decode


class ScheduleOps:
    """The schedule operations of one deployment."""

    def __init__(self, store: Store):
        self.store = store
        self.tasks = TaskOps(store)

    def _schedule_keys(self, sid: str) -> tuple[int, list[str]]:
        if "@" in sid:  # a run id of the schedule, not the schedule's
            raise TaskNotFound(sid)
        shard = self.store.locate(sid)
        k = self.store.keys
        return shard, [k.meta(shard), k.schedule(shard, sid), k.events(shard)]

    async def _now(self, now_ms: int | None) -> int:
        """Redis's time (or a test's override): a schedule's anchor and first planning
        cursor never come from this node's clock (store/clock.py)."""
        if now_ms is not None:
            return now_ms
        return await self.store.clock.now_ms_fresh(self.store.client)

    async def _first_plan(self, spec: ScheduleSpec, now_ms: int) -> tuple[int, list[int], int]:
        """The first fire times after now, computed off the event loop (a tenant's cron
        decides the CPU they cost)."""
        cursor = now_ms  # fire times strictly after now
        until = now_ms + self.store.settings.plan_horizon_ms
        fires, after = await asyncio.to_thread(plan_fires, spec, cursor, until, MAX_FIRES_PER_CALL)
        return cursor, fires, after

    def _new_id(self, new: NewSchedule) -> tuple[int, str]:
        """The shard and id of a new schedule (derived from its idempotency key, if any)."""
        if new.idempotency_key is not None:
            token = ids.idempotent_token(new.tenant, "schedule\0" + new.idempotency_key)
        else:
            token = ids.new_token()
        shard = self.store.shard_for(new.tenant, token)
        return shard, ids.make_task_id(shard, token)

    def schedule_id(self, new: NewSchedule) -> str | None:
        """The id a create with an idempotency key gives its schedule (None without one)."""
        return self._new_id(new)[1] if new.idempotency_key is not None else None

    async def create(self, new: NewSchedule, *, now_ms: int | None = None) -> tuple[Schedule, bool]:
        """Store a schedule and materialize its first runs; returns (schedule, created).
        An idempotency key already used by this tenant returns the existing schedule.
        StorageFull (nothing written) when its shard's node is near its memory ceiling."""
        self.tasks.check_payload(new.payload_json)
        await self.store.placements.load(new.tenant)
        shard, sid = self._new_id(new)
        await self.store.guard.check([shard])
        _, keys = self._schedule_keys(sid)
        now = await self._now(now_ms)
        spec = new.spec
        if spec.every_s is not None and spec.anchor_ms is None and spec.start_at_ms is None:
            spec = dataclasses.replace(spec, anchor_ms=now)
        cursor, fires, after = await self._first_plan(spec, now)
        options = jittered(sid, new.options)
        call = Call(
            self.store.scripts.schedule_create,
            keys,
            [
                sid,
                new.tenant,
                new.queue,
                new.payload_json,
                json.dumps(options, separators=(",", ":")) if options else "",
                spec_json(spec),
                new.catchup,
                new.catchup_window_ms,
                new.overlap,
                new.max_runs,
                "1" if new.paused else "0",
                "1" if new.idempotency_key is not None else "0",
                cursor,
                fires_arg(fires),
                after,
                *planning_args(self.store, shard, now_ms),
            ],
            _checked(sid, "create"),
        )
        reply = await self.store.write(call)
        return await self.get(new.tenant, sid), int(reply[0]) == 1

    async def get(self, tenant: str, sid: str) -> Schedule:
        """The schedule as stored. Another tenant's id is TaskNotFound, like an unknown one."""
        shard, keys = self._schedule_keys(sid)
        try:
            client = self.store.client
            raw = await client.hgetall(keys[1])
            h = {text(k): text(v) for k, v in raw.items()}
            if h.get("tenant") != tenant:
                raise TaskNotFound(sid)
            last = h.get("last_ms")
            # The first materialized run after the last one sent (sr keeps sent ones a while).
            first = await client.zrange(
                self.store.keys.schedule_runs(shard, sid),
                f"({last}" if last else "-inf",
                "+inf",
                byscore=True,
                offset=0,
                num=1,
                withscores=True,
            )
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"cannot read schedule: {exc}") from exc
        options = json.loads(h["opts"]) if h.get("opts") else {}
        next_ms = int(h.get("next_ms", "-1"))
        if next_ms >= 0:  # a fire time not planned yet: its run will be due after the offset
            next_ms += int(options.get("jitter_offset_ms", 0))
        state = h.get("state", "active")
        if first:
            next_ms = int(first[0][1])
            if state == "ended":
                state = "active"  # planning has ended, but runs it made are still to go
        elif state != "active":
            next_ms = -1
        return Schedule(
            id=sid,
            tenant=tenant,
            queue=h["queue"],
            spec=spec_from_json(h["spec"]),
            payload_json=h["payload"],
            options=options,
            catchup=h["catchup"],
            catchup_window_ms=int(h["window_ms"]),
            overlap=h["overlap"],
            max_runs=int(h.get("max_runs") or 0),
            state=state,
            next_run_ms=next_ms if next_ms >= 0 else None,
            last_run_ms=int(last) if last else None,
            runs_planned=int(h.get("planned") or 0),
            created_ms=int(h["created_ms"]),
            updated_ms=int(h["updated_ms"]),
            version=int(h.get("version") or 0),
        )

    async def update(
        self, tenant: str, sid: str, changes: ScheduleChanges, *, now_ms: int | None = None
    ) -> Schedule:
        """Change a schedule: its materialized runs not yet sent are replaced at once.

        The new fire times are computed from the schedule as read; the script refuses if
        it changed meanwhile, and the read and the computation start again. A schedule
        not paused plans runs again: StorageFull near the memory ceiling."""
        if changes.payload_json is not None:
            self.tasks.check_payload(changes.payload_json)
        for _ in range(UPDATE_TRIES):
            current = await self.get(tenant, sid)
            if current.state != "paused":
                await self.store.guard.check([self.store.locate(sid)])
            if await self._update_once(current, changes, now_ms):
                return await self.get(tenant, sid)
        raise ScriptError(f"schedule {sid} kept changing during {UPDATE_TRIES} update tries")

    async def _update_once(
        self, current: Schedule, changes: ScheduleChanges, now_ms: int | None
    ) -> bool:
        """One try of update; False if the schedule changed since `current`."""
        sid, tenant = current.id, current.tenant
        flat: list[str] = []

        def put(name: str, value: object) -> None:
            flat.extend((name, str(value)))

        spec = current.spec
        if callable(changes.spec):
            spec = changes.spec(current.spec)
        elif changes.spec is not None:
            spec = changes.spec
        if spec != current.spec:
            put("spec", spec_json(spec))
        if changes.queue is not None:
            put("queue", changes.queue)
        if changes.payload_json is not None:
            put("payload", changes.payload_json)
        if changes.options:
            opts = jittered(sid, {**current.options, **changes.options})
            put("opts", json.dumps(opts, separators=(",", ":")))
        if changes.catchup is not None:
            put("catchup", changes.catchup)
        if changes.catchup_window_ms is not None:
            put("window_ms", changes.catchup_window_ms)
        if changes.overlap is not None:
            put("overlap", changes.overlap)
        if changes.max_runs is not None:
            put("max_runs", changes.max_runs)
        now = await self._now(now_ms)
        cursor, fires, after = await self._first_plan(spec, now)
        shard, keys = self._schedule_keys(sid)
        call = Call(
            self.store.scripts.schedule_update,
            keys,
            [
                sid,
                tenant,
                json.dumps(flat),
                cursor,
                fires_arg(fires),
                after,
                *planning_args(self.store, shard, now_ms),
                current.version,
            ],
            _checked(sid, "update"),
        )
        reply = await self.store.write(call)
        return int(reply[0]) == 1

    async def pause(self, tenant: str, sid: str, *, now_ms: int | None = None) -> Schedule:
        """Stop materializing; drop the runs not yet sent (runs in flight finish)."""
        shard, keys = self._schedule_keys(sid)
        call = Call(
            self.store.scripts.schedule_pause,
            keys,
            [sid, tenant, *self.store.shared(shard, now_ms, wake=False)],
            _checked(sid, "pause"),
        )
        await self.store.write(call)
        return await self.get(tenant, sid)

    async def resume(self, tenant: str, sid: str, *, now_ms: int | None = None) -> Schedule:
        """Active again; the fire times of the paused span follow the catchup policy."""
        _, keys = self._schedule_keys(sid)
        call = Call(
            self.store.scripts.schedule_resume,
            keys[1:],
            [sid, tenant, clock_arg(now_ms), self.store.settings.event_log_max],
            _checked(sid, "resume"),
        )
        await self.store.write(call)
        return await self.get(tenant, sid)

    async def delete(self, tenant: str, sid: str, *, now_ms: int | None = None) -> int:
        """Delete a schedule and its runs not yet sent; returns how many runs were dropped."""
        shard, keys = self._schedule_keys(sid)
        call = Call(
            self.store.scripts.schedule_delete,
            keys,
            [sid, tenant, *self.store.shared(shard, now_ms, wake=False)],
            _checked(sid, "delete"),
        )
        reply = await self.store.write(call)
        return int(reply[1])

    async def trigger(
        self,
        tenant: str,
        sid: str,
        *,
        now_ms: int | None = None,
        admit: Admit | None = None,
        caps: CapOf | None = None,
    ) -> str:
        """One run now, id '<sid>@manual-<ms>', exempt from catchup and overlap; its run id.
        StorageFull near the memory ceiling; `admit` is asked first; OverLimit when the
        schedule's shard holds the tenant's cap (`caps`, as for task creates)."""
        if admit is not None:
            await admit(await self.get(tenant, sid), 1)
        reply = await self._add_runs(tenant, sid, "manual", [], now_ms, caps)
        return text(reply[3])

    async def backfill(
        self,
        tenant: str,
        sid: str,
        from_ms: int,
        to_ms: int,
        *,
        now_ms: int | None = None,
        admit: Admit | None = None,
        caps: CapOf | None = None,
    ) -> tuple[int, int]:
        """Materialize every fire time in [from_ms, to_ms] (at most MAX_BACKFILL), sent at
        once, oldest first; fire times that already have a run are not run again.
        Returns (added, existing). StorageFull near the memory ceiling; `admit` is asked
        with the number of fire times first; OverLimit (nothing added) when the runs not
        there yet would pass the tenant's cap in the schedule's shard (`caps`)."""
        current = await self.get(tenant, sid)
        if to_ms < from_ms:
            raise ValidationError("to is before from", field="to")
        # Every fire time of the range: start_at and end_at bound the planner, not this.
        unbounded = dataclasses.replace(current.spec, start_at_ms=None, end_at_ms=None)
        fires = await asyncio.to_thread(fire_times, unbounded, from_ms - 1, to_ms, MAX_BACKFILL + 1)
        if len(fires) > MAX_BACKFILL:
            raise ValidationError(
                f"the range holds more than {MAX_BACKFILL} fire times; backfill it in parts",
                field="to",
            )
        if admit is not None:
            await admit(current, len(fires))
        reply = await self._add_runs(tenant, sid, "backfill", fires, now_ms, caps)
        return int(reply[1]), int(reply[2])

    async def _add_runs(
        self,
        tenant: str,
        sid: str,
        origin: str,
        fires: Sequence[int],
        now_ms: int | None,
        caps: CapOf | None = None,
    ) -> list[Any]:
        shard, keys = self._schedule_keys(sid)
        await self.store.guard.check([shard])
        cap = caps(tenant, shard) if caps is not None else None
        call = Call(
            self.store.scripts.schedule_add_runs,
            keys,
            [
                sid,
                tenant,
                origin,
                fires_arg(fires),
                *self.store.shared(shard, now_ms),
                "" if cap is None else cap,
            ],
            _checked(sid, origin),
        )
        reply: list[Any] = await self.store.write(call)
        if int(reply[0]) == REFUSED:
            raise refusal(int(reply[1]), int(reply[2]), shard)
        return reply
