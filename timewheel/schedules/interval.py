"""How often a schedule fires at its closest: the shortest time between two of its fire
times, which a tenant's `min_interval_s` bounds. Pure.

An interval schedule's is its `every_s`. A cron's is found from its fields rather than
by walking fire times (a per-second cron would need 86,400 steps for one day):

- within a day, it fires at the wall-clock times made of its hour, minute and second
  values; two consecutive ones differ in the second, or step to the next minute or hour,
  so the closest values of each field give the candidates;
- from one matching day to the next, the last time of the one and the first of the
  other are `wrap + (days - 1) * 86,400` seconds apart, where wrap is the gap from the
  last time of a day to the first time of the next and days the fewest days between two
  matching days (found by walking the days the cron matches, at most MAX_DAYS of them).

Times are wall-clock times: a daylight-saving change can bring two fire times closer in
real time (a spring-forward gap fires its missed times at its end, as one instant).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache

from croniter import croniter

from timewheel.schedules.spec import ScheduleSpec

DAY_S = 86_400
MAX_DAYS = 400
"""Most matching days walked to find the fewest days between two of them (over a year
of any daily pattern)."""
MAX_SPAN_DAYS = 1_500
"""How far the walk over matching days goes at most: past a leap-year cycle, so every
day-of-month and month pairing has come round (a February 29 does twice)."""
_START = datetime(2000, 1, 1)


def shortest_interval_s(spec: ScheduleSpec) -> float:
    """The shortest time between two fire times of `spec`, in seconds."""
    if spec.every_s is not None:
        return spec.every_s
    assert spec.cron is not None
    return float(_cron_shortest_s(spec.cron))


def _values(field: Sequence[object], size: int) -> list[int]:
    """A cron field's values as croniter expands it ('*' is every value)."""
    if field == ["*"]:
        return list(range(size))
    return sorted({int(str(v)) for v in field})


def _closest(values: list[int]) -> int | None:
    """The smallest step between two consecutive values (None for a single value)."""
    if len(values) < 2:
        return None
    return min(b - a for a, b in itertools.pairwise(values))


@lru_cache(maxsize=4096)
def _cron_shortest_s(cron: str) -> int:
    fields = cron.split()
    six = len(fields) == 6
    expanded = croniter(cron, second_at_beginning=six).expanded
    minutes, hours = _values(expanded[0], 60), _values(expanded[1], 24)
    seconds = _values(expanded[5], 60) if six else [0]
    # A day's fire times are hours x minutes x seconds in that order, so two consecutive
    # ones differ in their second, or step to the next minute (from the last second to
    # the first), or to the next hour (from the last minute and second to the first).
    s_span = seconds[-1] - seconds[0]
    ms_span = minutes[-1] * 60 + seconds[-1] - minutes[0] * 60 - seconds[0]
    candidates = []
    if (step := _closest(seconds)) is not None:
        candidates.append(step)
    if (step := _closest(minutes)) is not None:
        candidates.append(step * 60 - s_span)
    if (step := _closest(hours)) is not None:
        candidates.append(step * 3600 - ms_span)
    first = hours[0] * 3600 + minutes[0] * 60 + seconds[0]
    last = hours[-1] * 3600 + minutes[-1] * 60 + seconds[-1]
    wrap = DAY_S - last + first
    candidates.append(wrap + (_fewest_days_apart(" ".join(fields[-3:])) - 1) * DAY_S)
    return min(candidates)


@lru_cache(maxsize=4096)
def _fewest_days_apart(day_fields: str) -> int:
    """The fewest days between two days that day-of-month, month and day-of-week
    (`day_fields`) match, over the first MAX_DAYS of them within MAX_SPAN_DAYS."""
    walk = croniter(f"0 0 {day_fields}", _START)
    previous: datetime = walk.get_next(datetime)
    fewest = 0
    for _ in range(MAX_DAYS - 1):
        day: datetime = walk.get_next(datetime)
        if (day - _START).days > MAX_SPAN_DAYS and fewest > 0:
            break
        apart = (day - previous).days
        fewest = apart if fewest == 0 else min(fewest, apart)
        if fewest == 1:
            break
        previous = day
    return max(fewest, 1)
