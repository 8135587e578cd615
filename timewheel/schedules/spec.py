"""When a recurring schedule fires: cron in an IANA time zone, or every N seconds. Pure.

Cron expressions are evaluated on local wall-clock time (croniter on naive datetimes) and
each local time is then placed on the real time line with zoneinfo:

- a local time that does not exist (spring forward) fires once, at the first valid
  instant after the gap (02:30 on a night that jumps from 02:00 to 03:00 fires at 03:00);
- a local time that occurs twice (fall back) fires once, at its first occurrence, unless
  the hour field is `*`: such a schedule fires once per real hour, so it fires in both
  occurrences of the repeated hour;
- fire times are unique instants (several local times that land on one instant, such as
  02:00 and 02:30 in a gap and 03:00 itself, fire once).

Cron has 5 fields, or 6 with seconds first (`*/10 * * * * *`, as Quartz and Temporal).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, croniter

from timewheel.errors import InvalidSchedule

MAX_FIRES = 10_000
"""Most fire times one call computes (the planner asks for a horizon at a time)."""


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """When a schedule fires. Exactly one of `cron` and `every_s`."""

    cron: str | None = None
    """5 fields, or 6 with seconds first."""
    timezone: str = "UTC"
    """IANA name; cron fields are local wall-clock time there."""
    every_s: float | None = None
    """Interval in seconds (>= 1), counted from anchor_ms."""
    anchor_ms: int | None = None
    """Where an interval counts from: start_at_ms when None (the epoch when that is None
    too). A schedule created without start_at is anchored at its creation, so schedules
    made at different moments fire at different phases, not all on the same second."""
    start_at_ms: int | None = None
    """No fire before this instant (inclusive)."""
    end_at_ms: int | None = None
    """No fire after this instant (inclusive)."""

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.every_s is None):
            raise InvalidSchedule("give exactly one of cron and every_s", field="cron")
        if self.cron is not None:
            fields = self.cron.split()
            if len(fields) not in (5, 6) or not croniter.is_valid(
                self.cron, second_at_beginning=len(fields) == 6
            ):
                raise InvalidSchedule(
                    f"cron {self.cron!r} is not a valid 5- or 6-field expression", field="cron"
                )
        if self.every_s is not None and (
            not math.isfinite(self.every_s) or not 1 <= self.every_s <= 366 * 86400
        ):
            raise InvalidSchedule(
                "every_s must be 1 .. 31,622,400 (1 s .. 366 days)", field="every_s"
            )
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise InvalidSchedule(
                f"unknown time zone {self.timezone!r}", field="timezone"
            ) from None
        if (
            self.start_at_ms is not None
            and self.end_at_ms is not None
            and self.end_at_ms < self.start_at_ms
        ):
            raise InvalidSchedule("end_at is before start_at", field="end_at")


def _ms(moment: datetime) -> int:
    return round(moment.timestamp() * 1000)


def _exists(naive: datetime, tz: ZoneInfo) -> bool:
    aware = naive.replace(tzinfo=tz)
    return aware.astimezone(UTC).astimezone(tz).replace(tzinfo=None) == naive


def _ambiguous(naive: datetime, tz: ZoneInfo) -> bool:
    return (
        naive.replace(tzinfo=tz, fold=0).utcoffset() != naive.replace(tzinfo=tz, fold=1).utcoffset()
    )


def _gap_end(naive: datetime, tz: ZoneInfo) -> datetime:
    """The first real instant whose local wall time is at or after a nonexistent `naive`."""
    low = naive.replace(tzinfo=tz, fold=1).astimezone(UTC)  # read with the later offset
    high = naive.replace(tzinfo=tz, fold=0).astimezone(UTC)  # read with the earlier one
    low, high = min(low, high), max(low, high)
    while high - low > timedelta(seconds=1):  # bisect: local wall time grows with real time
        mid = low + (high - low) / 2
        if mid.astimezone(tz).replace(tzinfo=None) >= naive:
            high = mid
        else:
            low = mid
    return high.replace(microsecond=0)


def _instants(naive: datetime, tz: ZoneInfo, every_hour: bool) -> list[datetime]:
    if not _exists(naive, tz):
        return [_gap_end(naive, tz)]
    if _ambiguous(naive, tz):
        first = naive.replace(tzinfo=tz, fold=0)
        return [first, naive.replace(tzinfo=tz, fold=1)] if every_hour else [first]
    return [naive.replace(tzinfo=tz)]


def fire_times(
    spec: ScheduleSpec, after_ms: int, until_ms: int, limit: int = MAX_FIRES
) -> list[int]:
    """Fire times in (after_ms, until_ms], ascending, unique, at most `limit`, in epoch ms."""
    low = max(after_ms, (spec.start_at_ms - 1) if spec.start_at_ms is not None else after_ms)
    high = min(until_ms, spec.end_at_ms) if spec.end_at_ms is not None else until_ms
    limit = min(limit, MAX_FIRES)
    if high <= low or limit <= 0:
        return []
    if spec.every_s is not None:
        step_ms = round(spec.every_s * 1000)
        origin = spec.anchor_ms if spec.anchor_ms is not None else (spec.start_at_ms or 0)
        first = origin + ((low - origin) // step_ms + 1) * step_ms
        last = min(high, first + step_ms * (limit - 1))
        return list(range(first, last + 1, step_ms))
    assert spec.cron is not None
    tz = ZoneInfo(spec.timezone)
    fields = spec.cron.split()
    every_hour = fields[-4] == "*"
    # Start two hours early in local wall time: a repeated hour (fall back) may hold
    # fires after `low` whose wall time reads earlier than low's.
    start = datetime.fromtimestamp(low / 1000, tz).replace(tzinfo=None) - timedelta(hours=2)
    it = croniter(spec.cron, start, second_at_beginning=len(fields) == 6)
    found: set[int] = set()
    horizon = high + 3 * 3_600_000  # local candidates past this cannot land before high
    while len(found) < limit * 2 + 8:
        try:
            naive: datetime = it.get_next(datetime)
        except CroniterBadDateError:  # no date matches within croniter's search span
            break
        instants = _instants(naive, tz, every_hour)
        if _ms(naive.replace(tzinfo=tz, fold=0)) > horizon:
            break
        found.update(m for m in map(_ms, instants) if low < m <= high)
    return sorted(found)[:limit]


FAR_FUTURE_MS = 4_102_444_800_000  # 2100-01-01: no fire time is planned past it


def next_fire(spec: ScheduleSpec, after_ms: int) -> int | None:
    """The first fire time after `after_ms`, or None when the schedule has no more."""
    found = fire_times(spec, after_ms, FAR_FUTURE_MS, 1)
    return found[0] if found else None


def plan_fires(
    spec: ScheduleSpec, cursor_ms: int, until_ms: int, limit: int
) -> tuple[list[int], int]:
    """The fire times after `cursor_ms` up to `until_ms` (at most `limit`), and the one
    after them (-1 when there is none): what a materialize call takes."""
    fires = fire_times(spec, cursor_ms, until_ms, limit)
    after = next_fire(spec, fires[-1] if fires else cursor_ms)
    return fires, -1 if after is None else after
