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

How it is computed: one walk over the local times the cron matches, from the wall time
of the instant the fire times must follow, gives them in real-time order, so the next
fire of any cron is a few croniter steps away. Placed as above, local times land on
non-decreasing instants (a repeated time at its first occurrence), save the second
occurrence of a repeated hour: it comes after every first occurrence and before the
first local time past the repeated hour, so there a second walk over the repeated
hour's wall times is inserted (hour field `*` only). An instant inside a second
occurrence starts with that second walk, then goes on past the repeated hour. Zone
transitions are looked at only where a local time is missing or repeated (zoneinfo
says which), each found by bisection on the UTC offset; a walk that meets a gap goes
on from its end, as the whole gap fires at one instant.
"""

from __future__ import annotations

import copy
import math
import zoneinfo
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter

from timewheel.errors import InvalidSchedule

MAX_FIRES = 10_000
"""Most fire times one call computes (the planner asks for a horizon at a time)."""

_SECOND = timedelta(seconds=1)
_PARSED_AT = datetime(2000, 1, 1)
"""Where a parsed cron starts, and where the check that it fires at all looks from:
every cron that fires does so within croniter's 50-year search from any instant (a
Feb 29 on a given weekday recurs within 40 years)."""


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
            problem = _cron_problem(self.cron)
            if problem is not None:
                raise InvalidSchedule(f"cron {self.cron!r} {problem}", field="cron")
        if self.every_s is not None and (
            not math.isfinite(self.every_s) or not 1 <= self.every_s <= 366 * 86400
        ):
            raise InvalidSchedule(
                "every_s must be 1 .. 31,622,400 (1 s .. 366 days)", field="every_s"
            )
        if not _known_zone(self.timezone):
            raise InvalidSchedule(f"unknown time zone {self.timezone!r}", field="timezone")
        if (
            self.start_at_ms is not None
            and self.end_at_ms is not None
            and self.end_at_ms < self.start_at_ms
        ):
            raise InvalidSchedule("end_at is before start_at", field="end_at")

    @classmethod
    def stored(
        cls,
        *,
        cron: str | None,
        timezone: str,
        every_s: float | None,
        anchor_ms: int | None,
        start_at_ms: int | None,
        end_at_ms: int | None,
    ) -> ScheduleSpec:
        """A spec as read back from Redis, taken as it was stored: the checks above are
        for what a client sends, and a schedule the deployment already holds (a zone
        alias such as posix/Europe/Berlin, a cron that no longer fires) must stay
        readable, listable and deletable."""
        spec = object.__new__(cls)
        for name, value in (
            ("cron", cron),
            ("timezone", timezone),
            ("every_s", every_s),
            ("anchor_ms", anchor_ms),
            ("start_at_ms", start_at_ms),
            ("end_at_ms", end_at_ms),
        ):
            object.__setattr__(spec, name, value)
        return spec


@lru_cache(maxsize=4096)
def _cron_problem(cron: str) -> str | None:
    """What is wrong with a cron expression (None: nothing). Cached: every spec read from
    Redis is checked again."""
    fields = len(cron.split())
    six = fields == 6
    if fields not in (5, 6) or not croniter.is_valid(cron, second_at_beginning=six):
        return "is not a valid 5- or 6-field expression"
    try:
        _walk(cron, _PARSED_AT).get_next(datetime)
    except CroniterError:  # no date matches (Feb 30, Apr 31)
        return "never fires (no date matches it)"
    return None


@lru_cache(maxsize=1)
def _zone_names() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def _known_zone(name: object) -> bool:
    """An IANA zone zoneinfo can load: not a directory of the database ("America"), a
    path ("../x", "/etc/localtime"), a special file (posix/, right/) or another file."""
    if not isinstance(name, str) or name not in _zone_names():
        return False
    try:
        _zone(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return False
    return True


@lru_cache(maxsize=1024)
def _zone(name: str) -> ZoneInfo:
    """The zone, kept: ZoneInfo holds only a few zones strongly and reads others again."""
    return ZoneInfo(name)


@lru_cache(maxsize=4096)
def _parsed(cron: str) -> croniter:
    return croniter(cron, _PARSED_AT, second_at_beginning=len(cron.split()) == 6)


def _walk(cron: str, after: datetime) -> croniter:
    """A walk over the local times `cron` matches, from the first one past `after`: a
    copy of the parsed expression (parsing costs about 100 us, a copy a few)."""
    walk = copy.copy(_parsed(cron))
    walk.set_current(after, force=True)
    return walk


def _ms(moment: datetime) -> int:
    return round(moment.timestamp() * 1000)


def _exists(naive: datetime, tz: ZoneInfo) -> bool:
    aware = naive.replace(tzinfo=tz)
    return aware.astimezone(UTC).astimezone(tz).replace(tzinfo=None) == naive


def _ambiguous(naive: datetime, tz: ZoneInfo) -> bool:
    return (
        naive.replace(tzinfo=tz, fold=0).utcoffset() != naive.replace(tzinfo=tz, fold=1).utcoffset()
    )


def _transition(tz: ZoneInfo, naive: datetime) -> int:
    """The zone transition that makes `naive` missing or repeated, in epoch seconds: the
    first second with the new UTC offset, bisected between the two readings of `naive`."""
    one = naive.replace(tzinfo=tz, fold=0).timestamp()
    other = naive.replace(tzinfo=tz, fold=1).timestamp()
    before, after = math.floor(min(one, other)), math.ceil(max(one, other))
    offset = datetime.fromtimestamp(before, tz).utcoffset()
    while after - before > 1:
        mid = (before + after) // 2
        if datetime.fromtimestamp(mid, tz).utcoffset() == offset:
            before = mid
        else:
            after = mid
    return after


def _repeated_hour(naive: datetime, tz: ZoneInfo) -> tuple[datetime, datetime]:
    """The wall times [first, end) that occur twice around a repeated `naive`."""
    first = datetime.fromtimestamp(_transition(tz, naive), tz)
    earlier = naive.replace(tzinfo=tz, fold=0).utcoffset()
    later = first.utcoffset()
    assert earlier is not None and later is not None
    start = first.replace(tzinfo=None)
    return start, start + (earlier - later)


def _second_occurrence(cron: str, tz: ZoneInfo, after: datetime, end: datetime) -> Iterator[int]:
    """The second occurrences of the local times in (after, end) that `cron` matches."""
    walk = _walk(cron, after)
    while True:
        try:
            naive: datetime = walk.get_next(datetime)
        except CroniterBadDateError:
            return
        if naive >= end:
            return
        yield _ms(naive.replace(tzinfo=tz, fold=1))


def _cron_fires(cron: str, tz: ZoneInfo, low: int) -> Iterator[int]:
    """The instants `cron` fires at after `low` in ms, ascending; a value may repeat."""
    every_hour = cron.split()[-4] == "*"
    at = datetime.fromtimestamp(low / 1000, tz)
    wall = at.replace(tzinfo=None)
    walk = _walk(cron, wall)
    pending: tuple[datetime, datetime] | None = None  # a repeated hour to fire again
    if _ambiguous(wall, tz):  # `low` is in a repeated hour
        first, end = _repeated_hour(wall, tz)
        if at.fold:  # in its second occurrence: no first occurrence is left
            if every_hour:
                yield from _second_occurrence(cron, tz, wall, end)
            walk.set_current(end - _SECOND, force=True)
        elif every_hour:
            pending = first, end
    while True:
        try:
            naive: datetime = walk.get_next(datetime)
        except CroniterBadDateError:  # no date matches within croniter's search span
            break
        if pending is not None and naive >= pending[1]:
            yield from _second_occurrence(cron, tz, pending[0] - _SECOND, pending[1])
            pending = None
        if not _exists(naive, tz):
            gap_end = _transition(tz, naive)
            yield gap_end * 1000
            # The rest of the gap lands on the same instant: go on from its end.
            walk.set_current(
                datetime.fromtimestamp(gap_end, tz).replace(tzinfo=None) - _SECOND, force=True
            )
        else:
            yield _ms(naive.replace(tzinfo=tz))  # fold 0: a repeated time's first occurrence
            if every_hour and pending is None and _ambiguous(naive, tz):
                pending = _repeated_hour(naive, tz)
    if pending is not None:
        yield from _second_occurrence(cron, tz, pending[0] - _SECOND, pending[1])


def _low(spec: ScheduleSpec, after_ms: int) -> int:
    """Fire times must be past this: after `after_ms`, and at or after start_at."""
    return max(after_ms, (spec.start_at_ms - 1) if spec.start_at_ms is not None else after_ms)


def _first_every(spec: ScheduleSpec, low: int) -> tuple[int, int]:
    """An interval schedule's first fire time after `low`, and its step, in ms."""
    assert spec.every_s is not None
    step_ms = round(spec.every_s * 1000)
    origin = spec.anchor_ms if spec.anchor_ms is not None else (spec.start_at_ms or 0)
    return origin + ((low - origin) // step_ms + 1) * step_ms, step_ms


def _fires(spec: ScheduleSpec, low: int) -> Iterator[int]:
    """Every fire time after `low` in ms, ascending and unique (end_at not applied)."""
    if spec.every_s is not None:
        first, step_ms = _first_every(spec, low)
        yield from range(first, 2**63, step_ms)
        return
    assert spec.cron is not None
    last = low
    for fire in _cron_fires(spec.cron, _zone(spec.timezone), low):
        if fire > last:
            last = fire
            yield fire


def fire_times(
    spec: ScheduleSpec, after_ms: int, until_ms: int, limit: int = MAX_FIRES
) -> list[int]:
    """Fire times in (after_ms, until_ms], ascending, unique, at most `limit`, in epoch ms."""
    low = _low(spec, after_ms)
    high = min(until_ms, spec.end_at_ms) if spec.end_at_ms is not None else until_ms
    limit = min(limit, MAX_FIRES)
    if high <= low or limit <= 0:
        return []
    if spec.every_s is not None:
        first, step_ms = _first_every(spec, low)
        return list(range(first, min(high, first + step_ms * (limit - 1)) + 1, step_ms))
    found: list[int] = []
    for fire in _fires(spec, low):
        if fire > high:
            break
        found.append(fire)
        if len(found) == limit:
            break
    return found


FAR_FUTURE_MS = 4_102_444_800_000  # 2100-01-01: no fire time is planned past it


def next_fire(spec: ScheduleSpec, after_ms: int) -> int | None:
    """The first fire time after `after_ms`, or None when the schedule has no more."""
    found = fire_times(spec, after_ms, FAR_FUTURE_MS, 1)
    return found[0] if found else None


def plan_fires(
    spec: ScheduleSpec, cursor_ms: int, until_ms: int, limit: int
) -> tuple[list[int], int]:
    """The fire times after `cursor_ms` up to `until_ms` (at most `limit`), and the one
    after them (-1 when there is none): what a materialize call takes. One walk gives
    both: the one after is the next fire time the walk meets."""
    low = _low(spec, cursor_ms)
    end = spec.end_at_ms
    high = until_ms if end is None else min(until_ms, end)
    last = FAR_FUTURE_MS if end is None else min(FAR_FUTURE_MS, end)
    take = min(limit, MAX_FIRES) if high > low else 0
    fires: list[int] = []
    for fire in _fires(spec, low):
        if fire > high or len(fires) >= take:
            return fires, fire if fire <= last else -1
        fires.append(fire)
    return fires, -1
