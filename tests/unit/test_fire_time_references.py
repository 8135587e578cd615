"""fire_times, next_fire and plan_fires against two slow references over random crons,
zones and windows around DST transitions, and the DST cases worked out by hand. Pure: no
Redis, no waiting.

The references:

- `walk_reference`: fire_times as a walk over every local time from two hours before
  `low`'s wall time, each placed on the time line, all collected and sorted. It is the
  module's own rule applied to every candidate, with no shortcut at all.
- `real_time_reference`: a brute force over real time, one instant a second (6 fields)
  or a minute (5 fields; every offset and transition of the zones tested is on a whole
  minute). An instant fires when its wall time matches the cron and it is not the second
  occurrence of a repeated time (unless the hour field is `*`), or when it is the first
  instant after a gap in which some local time matches.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from croniter import CroniterBadDateError, croniter
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from timewheel.errors import InvalidSchedule
from timewheel.schedules.spec import MAX_FIRES, ScheduleSpec, fire_times, next_fire, plan_fires

ZONES = [
    "America/New_York",
    "Europe/Berlin",
    "Australia/Lord_Howe",  # 30-minute shift
    "Asia/Tehran",  # +03:30, changes at midnight until 2022
    "America/Santiago",  # changes at midnight
    "UTC",
]
HOUR_MS = 3_600_000
PROPERTY = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def ms(text: str) -> int:
    """Epoch ms of a UTC time written 'YYYY-MM-DD HH:MM[:SS]'."""
    return round(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


def utc(fire_ms: int) -> str:
    return datetime.fromtimestamp(fire_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _bounds(spec: ScheduleSpec, after_ms: int, until_ms: int) -> tuple[int, int]:
    low = max(after_ms, (spec.start_at_ms - 1) if spec.start_at_ms is not None else after_ms)
    high = min(until_ms, spec.end_at_ms) if spec.end_at_ms is not None else until_ms
    return low, high


def _aware_ms(moment: datetime) -> int:
    return round(moment.timestamp() * 1000)


def _placed(naive: datetime, tz: ZoneInfo, every_hour: bool) -> list[datetime]:
    """Where one local time fires: the module docstring's rule, applied literally."""
    aware = naive.replace(tzinfo=tz)
    if aware.astimezone(UTC).astimezone(tz).replace(tzinfo=None) != naive:  # in a gap
        low = naive.replace(tzinfo=tz, fold=1).astimezone(UTC)
        high = naive.replace(tzinfo=tz, fold=0).astimezone(UTC)
        low, high = min(low, high), max(low, high)
        while high - low > timedelta(seconds=1):
            mid = low + (high - low) / 2
            if mid.astimezone(tz).replace(tzinfo=None) >= naive:
                high = mid
            else:
                low = mid
        return [high.replace(microsecond=0)]
    first, second = naive.replace(tzinfo=tz, fold=0), naive.replace(tzinfo=tz, fold=1)
    if first.utcoffset() != second.utcoffset():  # repeated
        return [first, second] if every_hour else [first]
    return [aware]


def walk_reference(spec: ScheduleSpec, after_ms: int, until_ms: int, limit: int) -> list[int]:
    low, high = _bounds(spec, after_ms, until_ms)
    if high <= low or limit <= 0:
        return []
    assert spec.cron is not None
    tz, fields = ZoneInfo(spec.timezone), spec.cron.split()
    start = datetime.fromtimestamp(low / 1000, tz).replace(tzinfo=None) - timedelta(hours=2)
    walk = croniter(spec.cron, start, second_at_beginning=len(fields) == 6)
    found: set[int] = set()
    while True:
        try:
            naive: datetime = walk.get_next(datetime)
        except CroniterBadDateError:
            break
        if _aware_ms(naive.replace(tzinfo=tz, fold=0)) > high + 3 * HOUR_MS:
            break
        placed = map(_aware_ms, _placed(naive, tz, fields[-4] == "*"))
        found.update(m for m in placed if low < m <= high)
    return sorted(found)[: min(limit, MAX_FIRES)]


def real_time_reference(spec: ScheduleSpec, after_ms: int, until_ms: int, limit: int) -> list[int]:
    low, high = _bounds(spec, after_ms, until_ms)
    if high <= low or limit <= 0:
        return []
    assert spec.cron is not None
    tz, fields = ZoneInfo(spec.timezone), spec.cron.split()
    step = 1000 if len(fields) == 6 else 60_000
    moments = [
        (t, datetime.fromtimestamp(t / 1000, tz))
        for t in range((low // step) * step, high + 1, step)
    ]
    walls = [at.replace(tzinfo=None) for _, at in moments]
    start = min(walls) - timedelta(seconds=1)
    walk = croniter(spec.cron, start, second_at_beginning=len(fields) == 6)
    matches: set[datetime] = set()
    while (naive := walk.get_next(datetime)) <= max(walls):
        matches.add(naive)
    out: list[int] = []
    for (t, at), (_, before) in zip(moments[1:], moments, strict=False):
        wall = at.replace(tzinfo=None)
        fires = wall in matches and (at.fold == 0 or fields[-4] == "*")
        if at.utcoffset() > before.utcoffset():  # type: ignore[operator]
            gap = before.replace(tzinfo=None) + timedelta(milliseconds=step), wall
            fires = fires or any(gap[0] <= m < gap[1] for m in matches)
        if fires and t > low:
            out.append(t)
    return out[: min(limit, MAX_FIRES)]


@cache
def transitions(zone: str) -> list[int]:
    """The zone's UTC offset changes in 2019-2031, epoch ms."""
    tz, out = ZoneInfo(zone), []
    t = ms("2019-01-01 00:00")
    while t < ms("2031-01-01 00:00"):
        before = datetime.fromtimestamp(t / 1000, tz).utcoffset()
        if datetime.fromtimestamp(t / 1000 + 21_600, tz).utcoffset() != before:
            lo, hi = t // 1000, t // 1000 + 21_600
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if datetime.fromtimestamp(mid, tz).utcoffset() == before:
                    lo = mid
                else:
                    hi = mid
            out.append(hi * 1000)
        t += 21_600_000
    return out


SECONDS = ["0", "*/15", "30", "0,30", "10-20/5", "59"]
MINUTES = ["0", "30", "*/15", "0,30", "45", "*/7", "29-31", "59"]
HOURS = ["0", "1", "2", "3", "1-3", "*/2", "0,12", "23", "2,3"]
DAYS = ["1", "15", "L", "*/2", "1-7", "29", "31"]
MONTHS = ["3", "4", "9,10", "10,11", "*/2", "4-10"]
WEEKDAYS = ["0", "6", "1-5", "sun", "0,6"]


def star_or(values: list[str], stars: int) -> st.SearchStrategy[str]:
    """`*` for `stars` draws in len(values) + stars: a window of hours around a transition
    must hold matching times. (sampled_from draws uniformly; one_of and small integer
    ranges lean towards their first choices and bounds.)"""
    return st.sampled_from(["*"] * stars + values)


def chance(tenths: int) -> st.SearchStrategy[bool]:
    return st.sampled_from([True] * tenths + [False] * (10 - tenths))


MINUTE = 60_000
OFFSETS = [m * MINUTE for m in (-300, -130, -90, -61, -60, -31, -30, -1, 0, 1, 29, 30, 59, 60)]
SPANS_5 = [m * MINUTE for m in (0, 2, 15, 61, 90, 150, 360, 1560)]
SPANS_6 = [s * 1000 for s in (0, 2, 59, 300, 1000, 1860, 2400, 2400)]


@st.composite
def cases(draw: Any) -> tuple[ScheduleSpec, int, int, int]:
    """A spec, a window (after, until] near a DST transition more often than not, a limit."""
    zone = draw(st.sampled_from(ZONES))
    six = draw(st.booleans())
    fields = [draw(star_or(MINUTES, 4)), draw(star_or(HOURS, 12)), "*", "*", "*"]
    if draw(chance(4)):  # one date field restricted
        at = draw(st.sampled_from([2, 3, 4]))
        fields[at] = draw(st.sampled_from((DAYS, MONTHS, WEEKDAYS)[at - 2]))
    if six:
        fields.insert(0, draw(star_or(SECONDS, 4)))
    near = transitions(zone)
    if near and draw(chance(8)):
        anchor = draw(st.sampled_from(near))
    else:
        anchor = draw(st.integers(ms("2020-01-01 00:00"), ms("2030-01-01 00:00")))
    # Offsets and spans from lists (Hypothesis draws mostly tiny integers from a range).
    after = anchor + draw(st.sampled_from(OFFSETS)) + draw(st.integers(-1500, 1500))
    if draw(st.booleans()):
        after -= after % (1000 if six else 60_000)  # on a fire time's grid
    span = draw(st.sampled_from(SPANS_6 if six else SPANS_5)) + draw(st.integers(0, 999))
    bounds: dict[str, int] = {}
    if draw(chance(1)):
        bounds["start_at_ms"] = after + draw(st.integers(0, span))
    if draw(chance(1)):
        bounds["end_at_ms"] = after + draw(st.integers(0, span))
    assume(bounds.get("end_at_ms", 1) >= bounds.get("start_at_ms", 0))
    try:
        spec = ScheduleSpec(cron=" ".join(fields), timezone=zone, **bounds)
    except InvalidSchedule:  # never fires (the 31st of April)
        assume(False)
        raise
    limit = draw(st.sampled_from([1, 2, 3, 7, 60, 1000, MAX_FIRES]))
    return spec, after, after + span, limit


@PROPERTY
@given(cases())
def test_fire_times_agree_with_the_walk_over_every_local_time(
    case: tuple[ScheduleSpec, int, int, int],
) -> None:
    spec, after, until, limit = case
    assert fire_times(spec, after, until, limit) == walk_reference(spec, after, until, limit)


@PROPERTY
@given(cases())
def test_fire_times_agree_with_a_brute_force_over_real_time(
    case: tuple[ScheduleSpec, int, int, int],
) -> None:
    spec, after, until, limit = case
    assert fire_times(spec, after, until, limit) == real_time_reference(spec, after, until, limit)


@PROPERTY
@given(cases(), st.integers(1, 9))
def test_planning_in_steps_gives_every_fire_time_once_and_the_next_one(
    case: tuple[ScheduleSpec, int, int, int], chunk: int
) -> None:
    """As the planner does: a few fire times at a time from a cursor; the one after each
    step is where the next step starts."""
    spec, after, until, _ = case
    planned: list[int] = []
    cursor = after
    while True:
        fires, following = plan_fires(spec, cursor, until, chunk)
        assert fires == fire_times(spec, cursor, until, chunk)
        assert following == (next_fire(spec, fires[-1] if fires else cursor) or -1)
        planned += fires
        if len(fires) < chunk:
            break
        cursor = fires[-1]
    assert planned == real_time_reference(spec, after, until, MAX_FIRES)
    expected = walk_reference(spec, planned[-1] if planned else after, until + 2 * HOUR_MS, 1)
    if expected:  # the fire time after the window, when it comes soon
        assert following == expected[0]


# ---- the DST cases by hand (2026: New York changes on March 8 and November 1) --------


def fires_utc(cron: str, zone: str, after: str, until: str, limit: int = MAX_FIRES) -> list[str]:
    spec = ScheduleSpec(cron=cron, timezone=zone)
    return [utc(f) for f in fire_times(spec, ms(after), ms(until), limit)]


def next_utc(cron: str, zone: str, after: str) -> str:
    found = next_fire(ScheduleSpec(cron=cron, timezone=zone), ms(after))
    assert found is not None
    return utc(found)


NY = "America/New_York"


def test_per_second_at_spring_forward() -> None:
    # 01:59:59 EST is 06:59:59 UTC; 02:00:00-02:59:59 do not exist and fire once at 03:00
    # EDT (07:00:00 UTC) with 03:00:00 itself.
    assert fires_utc("* * * * * *", NY, "2026-03-08 06:59:58", "2026-03-08 07:00:02") == [
        "2026-03-08 06:59:59",
        "2026-03-08 07:00:00",
        "2026-03-08 07:00:01",
        "2026-03-08 07:00:02",
    ]
    assert next_utc("* * * * * *", NY, "2026-03-08 06:59:59.500") == "2026-03-08 07:00:00"
    assert next_utc("* * * * * *", NY, "2026-03-08 07:00:00") == "2026-03-08 07:00:01"


def test_per_second_at_fall_back_fires_every_real_second() -> None:
    # 01:00:00-01:59:59 happen twice (EDT, then EST): every real second fires.
    start, end = ms("2026-11-01 04:59:00"), ms("2026-11-01 06:01:00")
    spec = ScheduleSpec(cron="* * * * * *", timezone=NY)
    assert fire_times(spec, start, end) == list(range(start + 1000, end + 1, 1000))
    # In the first occurrence the next fire is the next second, not the second occurrence.
    assert next_utc("* * * * * *", NY, "2026-11-01 05:30:00") == "2026-11-01 05:30:01"
    assert next_utc("* * * * * *", NY, "2026-11-01 05:59:59") == "2026-11-01 06:00:00"
    assert next_utc("* * * * * *", NY, "2026-11-01 06:30:00") == "2026-11-01 06:30:01"
    # And as the planner asks, 100 at a time: the same seconds, each once.
    planned, cursor = [], start
    while cursor < end:
        fires, following = plan_fires(spec, cursor, end, 100)
        planned += fires
        assert following == fires[-1] + 1000
        cursor = fires[-1]
    assert planned == list(range(start + 1000, end + 1, 1000))


def test_per_minute_at_both_changes() -> None:
    assert fires_utc("* * * * *", NY, "2026-03-08 06:58", "2026-03-08 07:02") == [
        "2026-03-08 06:59:00",  # 01:59 EST
        "2026-03-08 07:00:00",  # 02:00-02:59 do not exist; 03:00 EDT
        "2026-03-08 07:01:00",
        "2026-03-08 07:02:00",
    ]
    start, end = ms("2026-11-01 04:59"), ms("2026-11-01 06:59")
    spec = ScheduleSpec(cron="* * * * *", timezone=NY)
    assert fire_times(spec, start, end) == list(range(start + 60_000, end + 1, 60_000))
    assert next_utc("* * * * *", NY, "2026-11-01 05:30") == "2026-11-01 05:31:00"  # 01:31 EDT
    assert next_utc("* * * * *", NY, "2026-11-01 05:59") == "2026-11-01 06:00:00"  # 01:00 EST


def test_hourly_at_both_changes() -> None:
    assert fires_utc("0 * * * *", NY, "2026-03-08 05:30", "2026-03-08 09:30") == [
        "2026-03-08 06:00:00",  # 01:00 EST
        "2026-03-08 07:00:00",  # 02:00 does not exist: 03:00 EDT
        "2026-03-08 08:00:00",
        "2026-03-08 09:00:00",
    ]
    assert fires_utc("0 * * * *", NY, "2026-11-01 03:30", "2026-11-01 07:30") == [
        "2026-11-01 04:00:00",  # 00:00 EDT
        "2026-11-01 05:00:00",  # 01:00 EDT
        "2026-11-01 06:00:00",  # 01:00 EST
        "2026-11-01 07:00:00",  # 02:00 EST
    ]
    assert next_utc("0 * * * *", NY, "2026-11-01 05:30") == "2026-11-01 06:00:00"
    # An hour field that is not `*`: 01:xx fires in the first occurrence only.
    assert fires_utc("*/20 1 * * *", NY, "2026-11-01 04:00", "2026-11-01 08:00") == [
        "2026-11-01 05:00:00",
        "2026-11-01 05:20:00",
        "2026-11-01 05:40:00",
    ]
    assert next_utc("*/20 1 * * *", NY, "2026-11-01 06:10") == "2026-11-02 06:00:00"


def test_half_past_two_at_both_changes() -> None:
    assert fires_utc("30 2 * * *", NY, "2026-03-07 12:00", "2026-03-09 12:00") == [
        "2026-03-08 07:00:00",  # no 02:30 that night: 03:00 EDT
        "2026-03-09 06:30:00",
    ]
    assert next_utc("30 2 * * *", NY, "2026-03-08 06:59:59") == "2026-03-08 07:00:00"
    # 02:30 is not repeated in New York (01:00-01:59 is): once, in EST.
    assert fires_utc("30 2 * * *", NY, "2026-10-31 12:00", "2026-11-02 12:00") == [
        "2026-11-01 07:30:00",
        "2026-11-02 07:30:00",
    ]
    # In Berlin 02:00-02:59 is repeated on October 25: 02:30 fires at its first (CEST).
    assert fires_utc("30 2 * * *", "Europe/Berlin", "2026-10-24 12:00", "2026-10-25 12:00") == [
        "2026-10-25 00:30:00"
    ]
    assert next_utc("30 2 * * *", "Europe/Berlin", "2026-10-25 00:30") == "2026-10-26 01:30:00"


def test_daily_at_both_changes() -> None:
    # Santiago changes at midnight: Sunday 2026-09-06 has no 00:00 (-04 to -03 at 04:00
    # UTC), and Saturday 2026-04-04 has 23:00-23:59 twice (-03, then -04).
    santiago = "America/Santiago"
    assert fires_utc("0 0 * * *", santiago, "2026-09-04 12:00", "2026-09-07 12:00") == [
        "2026-09-05 04:00:00",  # 00:00 -04
        "2026-09-06 04:00:00",  # 00:00 does not exist: 01:00 -03
        "2026-09-07 03:00:00",  # 00:00 -03
    ]
    assert fires_utc("30 23 * * *", santiago, "2026-04-03 12:00", "2026-04-06 12:00") == [
        "2026-04-04 02:30:00",  # 23:30 -03 on Friday
        "2026-04-05 02:30:00",  # Saturday's first 23:30 (-03), not its second (03:30 UTC)
        "2026-04-06 03:30:00",  # 23:30 -04
    ]
    assert fires_utc("0 9 * * *", NY, "2026-03-07 00:00", "2026-03-09 00:00") == [
        "2026-03-07 14:00:00",
        "2026-03-08 13:00:00",
    ]


def test_lord_howe_shifts_by_half_an_hour() -> None:
    lord_howe = "Australia/Lord_Howe"
    # 2026-04-05 02:00 +11 goes back to 01:30 +10:30 (15:00 UTC): 01:30-01:59 twice.
    assert fires_utc("45 * * * *", lord_howe, "2026-04-04 13:00", "2026-04-04 16:30") == [
        "2026-04-04 13:45:00",  # 00:45 +11
        "2026-04-04 14:45:00",  # 01:45 +11
        "2026-04-04 15:15:00",  # 01:45 +10:30
        "2026-04-04 16:15:00",  # 02:45 +10:30
    ]
    assert fires_utc("45 1 * * *", lord_howe, "2026-04-04 13:00", "2026-04-04 16:30") == [
        "2026-04-04 14:45:00"
    ]
    # 2026-10-04 02:00 +10:30 jumps to 02:30 +11 (15:30 UTC): 02:00-02:29 do not exist.
    assert fires_utc("*/15 2 * * *", lord_howe, "2026-10-03 15:00", "2026-10-03 16:00") == [
        "2026-10-03 15:30:00",  # 02:00 and 02:15 in the gap, and 02:30 itself
        "2026-10-03 15:45:00",
    ]


def test_the_next_fire_takes_a_few_steps_wherever_it_is_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Asked anywhere, near a gap or in either occurrence of a repeated hour included, the
    next fire of a per-second cron is a few croniter steps away."""
    steps = 0
    original = croniter.get_next

    def counted(self: croniter, *args: Any, **kwargs: Any) -> Any:
        nonlocal steps
        steps += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(croniter, "get_next", counted)
    spec = ScheduleSpec(cron="* * * * * *", timezone=NY)
    for when in [
        "2026-06-01 12:00:00",
        "2026-03-08 06:59:59.500",  # just before the gap
        "2026-03-08 07:00:00",
        "2026-11-01 05:00:00",  # the first occurrence of 01:00 EDT
        "2026-11-01 05:59:59.999",
        "2026-11-01 06:00:00",  # the second occurrence
        "2026-11-01 06:59:59",
    ]:
        steps = 0
        assert next_fire(spec, ms(when)) == ms(when) // 1000 * 1000 + 1000
        assert steps <= 3, when
        steps = 0
        fires, following = plan_fires(spec, ms(when), ms(when) + 30_000, 1000)
        assert len(fires) == 30 and following == fires[-1] + 1000 and steps <= 33, when


# ---- validation -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "zone",
    [
        "America",
        "Etc",
        "",
        "..",
        "../UTC",
        "America/../UTC",
        "/UTC",
        "/etc/localtime",
        "UTC/",
        "America/New_York/",
        "zone.tab",
        "tzdata.zi",
        "posix/UTC",
        "right/UTC",
        "Mars/Olympus",
        "America/New_York\x00",
        "x" * 300,
    ],
    ids=repr,
)
def test_a_time_zone_must_be_a_real_iana_zone(zone: str) -> None:
    with pytest.raises(InvalidSchedule) as info:
        ScheduleSpec(cron="0 * * * *", timezone=zone)
    assert info.value.field == "timezone"


@pytest.mark.parametrize(
    "zone", ["UTC", "Etc/UTC", "Etc/GMT+5", "America/New_York", "US/Eastern", *ZONES]
)
def test_iana_zones_are_accepted(zone: str) -> None:
    spec = ScheduleSpec(cron="0 * * * *", timezone=zone)
    assert next_fire(spec, 0) is not None


@pytest.mark.parametrize(
    "cron", ["0 0 30 2 *", "0 0 31 4 *", "0 0 31 2,4,6,9,11 *", "0 0 0 30 2 *", "* * 31 11 *"]
)
def test_a_cron_that_never_fires_is_refused(cron: str) -> None:
    with pytest.raises(InvalidSchedule) as info:
        ScheduleSpec(cron=cron)
    assert info.value.field == "cron"


@pytest.mark.parametrize(
    ("cron", "first"),
    [
        ("0 0 29 2 *", "2028-02-29 00:00:00"),
        ("0 0 L 2 *", "2027-02-28 00:00:00"),
        ("0 0 30 2 1", "2027-02-01 00:00:00"),  # day of month OR day of week: Mondays
        ("0 0 29 2 1#5", "2044-02-29 00:00:00"),  # a Feb 29 that is the fifth Monday
    ],
)
def test_rare_crons_are_accepted(cron: str, first: str) -> None:
    assert next_utc(cron, "UTC", "2026-12-01 00:00") == first


def test_a_stored_spec_reads_back_even_where_a_new_one_would_be_refused() -> None:
    from timewheel.schedules.model import spec_from_json, spec_json

    for cron, zone in (("0 0 30 2 *", "UTC"), ("0 * * * *", "posix/Europe/Berlin")):
        with pytest.raises(InvalidSchedule):
            ScheduleSpec(cron=cron, timezone=zone)
        stored = ScheduleSpec.stored(
            cron=cron, timezone=zone, every_s=None, anchor_ms=None, start_at_ms=None, end_at_ms=None
        )
        again = spec_from_json(spec_json(stored))
        assert again == stored and (again.cron, again.timezone) == (cron, zone)
    berlin = spec_from_json(
        spec_json(
            ScheduleSpec.stored(
                cron="0 * * * *",
                timezone="posix/Europe/Berlin",
                every_s=None,
                anchor_ms=None,
                start_at_ms=None,
                end_at_ms=None,
            )
        )
    )
    assert next_fire(berlin, 0) == 3_600_000  # the alias still plans like the zone
