"""Fire-time maths of recurring schedules: pure, with fixed instants (no waiting, no Redis)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from timewheel.errors import InvalidSchedule
from timewheel.schedules.spec import ScheduleSpec, fire_times

NY = "America/New_York"


def ms(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> int:
    return round(datetime(year, month, day, hour, minute, second, tzinfo=UTC).timestamp() * 1000)


def utc(fire_ms: int) -> str:
    return datetime.fromtimestamp(fire_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def test_a_nonexistent_local_time_fires_once_at_the_next_valid_instant() -> None:
    spec = ScheduleSpec(cron="30 2 * * *", timezone=NY)
    fires = [utc(f) for f in fire_times(spec, ms(2026, 3, 7), ms(2026, 3, 10))]
    # 02:30 EST = 07:30 UTC; on 2026-03-08 there is no 02:30: 03:00 EDT = 07:00 UTC;
    # then 02:30 EDT = 06:30 UTC.
    assert fires == ["2026-03-07 07:30:00", "2026-03-08 07:00:00", "2026-03-09 06:30:00"]


def test_a_repeated_local_time_fires_once() -> None:
    spec = ScheduleSpec(cron="30 1 * * *", timezone=NY)
    fires = [utc(f) for f in fire_times(spec, ms(2026, 10, 31), ms(2026, 11, 3))]
    # 01:30 EDT = 05:30 UTC; on 2026-11-01 01:30 happens twice: only the first fires.
    assert fires == ["2026-10-31 05:30:00", "2026-11-01 05:30:00", "2026-11-02 06:30:00"]


@pytest.mark.parametrize(
    ("start", "end"),
    [((2026, 3, 8, 3), (2026, 3, 8, 10)), ((2026, 11, 1, 3), (2026, 11, 1, 10))],
)
def test_hourly_fires_once_per_real_hour_across_both_changes(
    start: tuple[int, int, int, int], end: tuple[int, int, int, int]
) -> None:
    spec = ScheduleSpec(cron="0 * * * *", timezone=NY)
    fires = fire_times(spec, ms(*start), ms(*end))
    # Every real hour boundary in (start, end] fires exactly once: 7 of them.
    assert [f - ms(*start) for f in fires] == [h * 3_600_000 for h in range(1, 8)]


def test_six_field_cron_has_seconds_first() -> None:
    spec = ScheduleSpec(cron="*/20 * * * * *")
    fires = fire_times(spec, ms(2026, 1, 1), ms(2026, 1, 1, 0, 1))
    assert [utc(f)[-5:] for f in fires] == ["00:20", "00:40", "01:00"]


def test_every_counts_from_start_and_stops_at_end() -> None:
    spec = ScheduleSpec(every_s=1, start_at_ms=ms(2026, 1, 1), end_at_ms=ms(2026, 1, 1, 0, 0, 10))
    fires = fire_times(spec, ms(2026, 1, 1) - 5000, ms(2026, 1, 2))
    assert fires == [ms(2026, 1, 1) + 1000 * i for i in range(11)]
    assert fire_times(spec, ms(2026, 1, 1, 0, 0, 3), ms(2026, 1, 1, 0, 0, 5)) == [
        ms(2026, 1, 1, 0, 0, 4),
        ms(2026, 1, 1, 0, 0, 5),
    ]


def test_limits_and_windows() -> None:
    spec = ScheduleSpec(cron="* * * * *", start_at_ms=ms(2026, 1, 1, 12))
    assert fire_times(spec, ms(2026, 1, 1), ms(2026, 1, 1, 12, 3)) == [
        ms(2026, 1, 1, 12, m) for m in range(4)
    ]
    assert len(fire_times(spec, ms(2026, 1, 1, 12), ms(2026, 1, 2), limit=5)) == 5
    assert fire_times(spec, ms(2026, 1, 2), ms(2026, 1, 1)) == []


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "* * *"}, "cron"),
        ({"cron": "0 * * * *", "every_s": 5}, "cron"),
        ({}, "cron"),
        ({"every_s": 0.5}, "every_s"),
        ({"cron": "0 * * * *", "timezone": "Mars/Olympus"}, "timezone"),
        ({"every_s": 5, "start_at_ms": 2000, "end_at_ms": 1000}, "end_at"),
    ],
)
def test_invalid_schedules_name_their_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidSchedule) as info:
        ScheduleSpec(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field
