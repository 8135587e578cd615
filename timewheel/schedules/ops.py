"""Recurring schedules: create, read, change and plan them (DESIGN.md section 7).

Where a schedule goes: `create_schedule` stores it in its shard (tag..'s:'..sid) and
materializes its first runs up to the plan horizon (lua/schedule_create.lua); the
planner (`plan`, run by the scheduler node holding the shard) extends every active
schedule as its horizon moves (lua/schedule_materialize.lua); the tick sends its runs like any
other, after the catchup and overlap checks of lua/lib/schedule.lua. Fire times are
computed here, in Python (timewheel/schedule.py); every move happens in Lua.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from timewheel import ids
from timewheel.errors import RedisUnavailable, ScriptError, TaskNotFound, ValidationError
from timewheel.models import JSONValue, ms_to_rfc3339
from timewheel.schedules.spec import ScheduleSpec, fire_times, plan_fires
from timewheel.store.library import ScriptArg, check
from timewheel.store.pipeline import ScriptCall, run_pipeline
from timewheel.tasks import window as spread

if TYPE_CHECKING:
    from timewheel.config import Settings
    from timewheel.store.connection import RedisClient
    from timewheel.store.keys import Keys
    from timewheel.store.library import Script, Scripts

CATCHUPS = ("skip", "latest", "all")
OVERLAPS = ("allow", "skip", "buffer_one")
MAX_BACKFILL = 1000
"""Most fire times one backfill call materializes."""
UPDATE_TRIES = 5
"""How often update_schedule reads again when the schedule changed under it."""
MAX_FIRES_PER_CALL = 1000
"""Most fire times one create, update or materialize call plans (bounds the call)."""


@dataclass(frozen=True, slots=True)
class NewSchedule:
    """A schedule create request, validated at the edge (times in epoch ms)."""

    tenant: str
    spec: ScheduleSpec
    queue: str = "default"
    payload_json: str = "null"
    options: dict[str, JSONValue] = field(default_factory=dict)
    """Options every run gets: retry, visibility_timeout_s; and jitter_s."""
    catchup: str = "skip"
    catchup_window_ms: int = 3_600_000
    overlap: str = "allow"
    max_runs: int = 0
    """0 = no limit."""
    paused: bool = False
    idempotency_key: str | None = None

    def __post_init__(self) -> None:
        if self.catchup not in CATCHUPS:
            raise ValidationError(f"catchup must be one of {', '.join(CATCHUPS)}", field="catchup")
        if self.overlap not in OVERLAPS:
            raise ValidationError(f"overlap must be one of {', '.join(OVERLAPS)}", field="overlap")


@dataclass(frozen=True, slots=True)
class ScheduleChanges:
    """A schedule update: None keeps the current value. Values that depend on the current
    schedule are applied to it by update_schedule, against the version it read."""

    spec: ScheduleSpec | Callable[[ScheduleSpec], ScheduleSpec] | None = None
    """A whole new timing, or a function of the current one (a PATCH of some fields)."""
    queue: str | None = None
    payload_json: str | None = None
    options: dict[str, JSONValue] | None = None
    """Run options set over the current ones (retry, visibility_timeout_s, jitter_s)."""
    catchup: str | None = None
    catchup_window_ms: int | None = None
    overlap: str | None = None
    max_runs: int | None = None


@dataclass(frozen=True, slots=True)
class Schedule:
    """A recurring schedule as stored."""

    id: str
    tenant: str
    queue: str
    spec: ScheduleSpec
    payload_json: str
    options: dict[str, JSONValue]
    catchup: str
    catchup_window_ms: int
    overlap: str
    max_runs: int
    state: str
    """active | paused | ended"""
    next_run_ms: int | None
    last_run_ms: int | None
    runs_planned: int
    created_ms: int
    updated_ms: int
    version: int = 0
    """Bumped by every change (update, pause, resume): what an update checks it read."""

    def to_json(self) -> dict[str, JSONValue]:
        """The public representation (HTTP API)."""
        spec = self.spec
        out: dict[str, JSONValue] = {"id": self.id, "queue": self.queue}
        if spec.cron is not None:
            out["cron"] = spec.cron
            out["timezone"] = spec.timezone
        else:
            every = spec.every_s or 0.0
            out["every_s"] = int(every) if float(every).is_integer() else every
        out.update(
            {
                "start_at": _rfc(spec.start_at_ms),
                "end_at": _rfc(spec.end_at_ms),
                "max_runs": self.max_runs or None,
                "payload": json.loads(self.payload_json),
                "catchup": self.catchup,
                "catchup_window_s": self.catchup_window_ms / 1000,
                "overlap": self.overlap,
                "state": self.state,
                "paused": self.state == "paused",
                "next_run_at": _rfc(self.next_run_ms),
                "last_run_at": _rfc(self.last_run_ms),
                "runs_planned": self.runs_planned,
                "created_at": ms_to_rfc3339(self.created_ms),
                "updated_at": ms_to_rfc3339(self.updated_ms),
            }
        )
        out.update(self.options)
        return out


@dataclass(frozen=True, slots=True)
class PlanResult:
    """One planner pass over a shard."""

    shard: int
    schedules: int
    added: int
    skipped: int
    more: bool
    """More schedules were due for planning than one pass reads."""
    earliest_next_ms: int | None = None
    """The earliest next fire time to plan among the schedules read (None: none read).
    Against the clock it says how far behind the planner is."""


def _rfc(ms: int | None) -> str | None:
    return None if ms is None else ms_to_rfc3339(ms)


def spec_json(spec: ScheduleSpec) -> str:
    return json.dumps(
        {
            "cron": spec.cron,
            "timezone": spec.timezone,
            "every_s": spec.every_s,
            "start_ms": spec.start_at_ms,
            "end_ms": spec.end_at_ms,
            "anchor_ms": spec.anchor_ms,
        },
        separators=(",", ":"),
    )


def spec_from_json(text: str) -> ScheduleSpec:
    d = json.loads(text)
    return ScheduleSpec(
        cron=d["cron"],
        timezone=d["timezone"],
        every_s=d["every_s"],
        start_at_ms=d["start_ms"],
        end_at_ms=d["end_ms"],
        anchor_ms=d.get("anchor_ms"),
    )


def jittered(sid: str, options: dict[str, JSONValue]) -> dict[str, JSONValue]:
    """Run options with the schedule's jitter offset for their jitter_s (lua/lib/schedule.lua
    makes each run due that long after its fire time). Raises ValidationError."""
    jitter_ms = spread.option_ms(options, "jitter_s")
    out = {k: v for k, v in options.items() if k != "jitter_offset_ms"}
    if jitter_ms:
        out["jitter_offset_ms"] = spread.offset_ms(sid, jitter_ms)
    return out


def _fires_arg(fires: Sequence[int]) -> str:
    return ",".join(map(str, fires))


def _now_ms() -> int:
    return int(time.time() * 1000)


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class ScheduleOps:
    """Schedule operations of the Engine (a mixin: it needs the attributes below)."""

    client: RedisClient
    settings: Settings
    keys: Keys
    scripts: Scripts

    if TYPE_CHECKING:

        async def call(
            self, script: Script, keys: Sequence[str], args: Sequence[ScriptArg]
        ) -> Any: ...

        async def write(
            self, script: Script, keys: Sequence[str], args: Sequence[ScriptArg]
        ) -> Any: ...

        def check_payload(self, payload_json: str) -> None: ...

    def _schedule_keys(self, sid: str) -> tuple[int, list[str]]:
        shard = ids.shard_of(sid)
        if shard is None or shard >= self.settings.shards or "@" in sid:
            raise TaskNotFound(sid)
        k = self.keys
        return shard, [k.meta(shard), k.schedule(shard, sid), k.events(shard)]

    def _first_plan(self, spec: ScheduleSpec, now_ms: int) -> tuple[int, list[int], int]:
        cursor = now_ms  # fire times strictly after now
        fires, after = plan_fires(
            spec, cursor, now_ms + self.settings.plan_horizon_ms, MAX_FIRES_PER_CALL
        )
        return cursor, fires, after

    async def create_schedule(
        self, new: NewSchedule, *, now_ms: int | None = None
    ) -> tuple[Schedule, bool]:
        """Store a schedule and materialize its first runs; returns (schedule, created).
        An idempotency key already used by this tenant returns the existing schedule."""
        self.check_payload(new.payload_json)
        if new.idempotency_key is not None:
            token = ids.idempotent_token(new.tenant, "schedule\0" + new.idempotency_key)
        else:
            token = ids.new_token()
        s = self.settings
        shard = ids.shard_for(new.tenant, token, s.default_spread, s.shards)
        sid = ids.make_task_id(shard, token)
        _, keys = self._schedule_keys(sid)
        now = _now_ms() if now_ms is None else now_ms
        spec = new.spec
        if spec.every_s is not None and spec.anchor_ms is None and spec.start_at_ms is None:
            spec = dataclasses.replace(spec, anchor_ms=now)
        cursor, fires, after = self._first_plan(spec, now)
        options = jittered(sid, new.options)
        reply = await self.write(
            self.scripts.schedule_create,
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
                _fires_arg(fires),
                after,
                s.bucket_ms,
                s.misfire_ms,
                "" if now_ms is None else now_ms,
                s.event_log_max,
                self.keys.wake_channel(),
                shard,
            ],
        )
        return await self.get_schedule(new.tenant, sid), int(reply[0]) == 1

    async def get_schedule(self, tenant: str, sid: str) -> Schedule:
        """The schedule as stored. Another tenant's id is TaskNotFound, like an unknown one."""
        shard, keys = self._schedule_keys(sid)
        try:
            raw = await self.client.hgetall(keys[1])
            h = {_text(k): _text(v) for k, v in raw.items()}
            if h.get("tenant") != tenant:
                raise TaskNotFound(sid)
            last = h.get("last_ms")
            # The first materialized run after the last one sent (sr keeps sent ones a while).
            first = await self.client.zrange(
                self.keys.schedule_runs(shard, sid),
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

    async def update_schedule(
        self, tenant: str, sid: str, changes: ScheduleChanges, *, now_ms: int | None = None
    ) -> Schedule:
        """Change a schedule: its materialized runs not yet sent are replaced at once.

        The new fire times are computed from the schedule as read; the script refuses if
        it changed meanwhile, and the read and the computation start again."""
        if changes.payload_json is not None:
            self.check_payload(changes.payload_json)
        for _ in range(UPDATE_TRIES):
            current = await self.get_schedule(tenant, sid)
            if await self._update_once(current, changes, now_ms):
                return await self.get_schedule(tenant, sid)
        raise ScriptError(f"schedule {sid} kept changing during {UPDATE_TRIES} update tries")

    async def _update_once(
        self, current: Schedule, changes: ScheduleChanges, now_ms: int | None
    ) -> bool:
        """One try of update_schedule; False if the schedule changed since `current`."""
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
        now = _now_ms() if now_ms is None else now_ms
        cursor, fires, after = self._first_plan(spec, now)
        shard, keys = self._schedule_keys(sid)
        s = self.settings
        reply = await self.write(
            self.scripts.schedule_update,
            keys,
            [
                sid,
                tenant,
                json.dumps(flat),
                cursor,
                _fires_arg(fires),
                after,
                s.bucket_ms,
                s.misfire_ms,
                "" if now_ms is None else now_ms,
                s.event_log_max,
                self.keys.wake_channel(),
                shard,
                current.version,
            ],
        )
        check(reply, run_id=sid, action="update")
        return int(reply[0]) == 1

    async def pause_schedule(self, tenant: str, sid: str, *, now_ms: int | None = None) -> Schedule:
        """Stop materializing; drop the runs not yet sent (runs in flight finish)."""
        _, keys = self._schedule_keys(sid)
        s = self.settings
        reply = await self.write(
            self.scripts.schedule_pause,
            keys,
            [sid, tenant, s.bucket_ms, "" if now_ms is None else now_ms, s.event_log_max],
        )
        check(reply, run_id=sid, action="pause")
        return await self.get_schedule(tenant, sid)

    async def resume_schedule(
        self, tenant: str, sid: str, *, now_ms: int | None = None
    ) -> Schedule:
        """Active again; the fire times of the paused span follow the catchup policy."""
        _, keys = self._schedule_keys(sid)
        reply = await self.write(
            self.scripts.schedule_resume,
            keys[1:],
            [sid, tenant, "" if now_ms is None else now_ms, self.settings.event_log_max],
        )
        check(reply, run_id=sid, action="resume")
        return await self.get_schedule(tenant, sid)

    async def delete_schedule(self, tenant: str, sid: str, *, now_ms: int | None = None) -> int:
        """Delete a schedule and its runs not yet sent; returns how many runs were dropped."""
        _, keys = self._schedule_keys(sid)
        s = self.settings
        reply = await self.write(
            self.scripts.schedule_delete,
            keys,
            [sid, tenant, s.bucket_ms, "" if now_ms is None else now_ms, s.event_log_max],
        )
        check(reply, run_id=sid, action="delete")
        return int(reply[1])

    async def trigger_schedule(self, tenant: str, sid: str, *, now_ms: int | None = None) -> str:
        """One run now, id '<sid>@manual-<ms>', exempt from catchup and overlap; its run id."""
        reply = await self._add_runs(tenant, sid, "manual", [], now_ms)
        return _text(reply[3])

    async def backfill_schedule(
        self, tenant: str, sid: str, from_ms: int, to_ms: int, *, now_ms: int | None = None
    ) -> tuple[int, int]:
        """Materialize every fire time in [from_ms, to_ms] (at most MAX_BACKFILL), sent at
        once, oldest first; fire times that already have a run are not run again.
        Returns (added, existing)."""
        current = await self.get_schedule(tenant, sid)
        if to_ms < from_ms:
            raise ValidationError("to is before from", field="to")
        # Every fire time of the range: start_at and end_at bound the planner, not this.
        unbounded = dataclasses.replace(current.spec, start_at_ms=None, end_at_ms=None)
        fires = fire_times(unbounded, from_ms - 1, to_ms, MAX_BACKFILL + 1)
        if len(fires) > MAX_BACKFILL:
            raise ValidationError(
                f"the range holds more than {MAX_BACKFILL} fire times; backfill it in parts",
                field="to",
            )
        reply = await self._add_runs(tenant, sid, "backfill", fires, now_ms)
        return int(reply[1]), int(reply[2])

    async def _add_runs(
        self, tenant: str, sid: str, origin: str, fires: Sequence[int], now_ms: int | None
    ) -> list[Any]:
        shard, keys = self._schedule_keys(sid)
        s = self.settings
        reply: list[Any] = await self.write(
            self.scripts.schedule_add_runs,
            keys,
            [
                sid,
                tenant,
                origin,
                _fires_arg(fires),
                s.bucket_ms,
                "" if now_ms is None else now_ms,
                s.event_log_max,
                self.keys.wake_channel(),
                shard,
            ],
        )
        check(reply, run_id=sid, action=origin)
        return reply

    # -- the planner ------------------------------------------------------------------

    async def plan(
        self,
        shard: int,
        *,
        node: str = "",
        epoch: int | str = "",
        now_ms: int | None = None,
        clock_ms: float | None = None,
        limit: int | None = None,
    ) -> PlanResult:
        """Extend up to `limit` (default plan_batch) active schedules of the shard whose
        next fire time is within 3/4 of the plan horizon, up to the full horizon: each
        call adds about a quarter horizon of runs, so planning work comes in small,
        even steps. Raises LeaseLost when fenced out.

        clock_ms: the caller's estimate of the shard clock, for the horizon; misfire
        decisions use Redis TIME in the script (or now_ms, an override for tests)."""
        s, k = self.settings, self.keys
        local = clock_ms if clock_ms is not None else _now_ms()
        now = now_ms if now_ms is not None else int(local)
        horizon, batch = s.plan_horizon_ms, limit or s.plan_batch
        try:
            due: list[Any] = await self.client.zrange(
                k.plan(shard),
                "-inf",
                now + horizon - horizon // 4,
                byscore=True,
                offset=0,
                num=batch,
                withscores=True,
            )
            sids = [_text(row[0]) for row in due]
            if not sids:
                return PlanResult(shard, 0, 0, 0, False)
            async with self.client.pipeline(transaction=False) as pipe:
                for sid in sids:
                    pipe.hmget(k.schedule(shard, sid), "spec", "cursor", "version", "state")
                rows = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"planner read failed: {exc}") from exc
        calls: list[ScriptCall] = []
        for sid, (spec_raw, cursor_raw, version, state) in zip(sids, rows, strict=True):
            if spec_raw is None or _text(state) != "active":
                continue
            cursor = int(cursor_raw)
            fires, after = plan_fires(
                spec_from_json(_text(spec_raw)), cursor, now + horizon, MAX_FIRES_PER_CALL
            )
            args: list[ScriptArg] = [
                sid,
                node,
                epoch,
                _text(version),
                _text(cursor_raw),
                _fires_arg(fires),
                after,
                s.bucket_ms,
                s.misfire_ms,
                "" if now_ms is None else now_ms,
                s.event_log_max,
                k.wake_channel(),
                shard,
            ]
            calls.append(
                (
                    self.scripts.schedule_materialize,
                    [k.meta(shard), k.schedule(shard, sid), k.events(shard)],
                    args,
                )
            )
        replies = await run_pipeline(self.client, calls) if calls else []
        added = skipped = 0
        for reply in replies:
            check(reply, action="materialize", shard=shard)
            added += int(reply[0])
            skipped += int(reply[1])
        return PlanResult(shard, len(sids), added, skipped, len(sids) >= batch, int(due[0][1]))
