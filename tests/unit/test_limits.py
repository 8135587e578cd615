"""Limits without a server: how often a schedule fires at its closest (against a walk over
its fire times), which limits apply to a tenant, the refusals, and the storage guard's
reading of INFO memory."""

from __future__ import annotations

import itertools
from datetime import datetime

import pytest
from croniter import croniter

from timewheel.config import Settings
from timewheel.errors import ConfigError
from timewheel.limits import Effective, Usage, over, runs_of, split
from timewheel.schedules.interval import shortest_interval_s
from timewheel.schedules.spec import ScheduleSpec
from timewheel.store.guard import reading_of
from timewheel.tenants import Limits


def walked_s(cron: str, steps: int = 3000) -> float:
    """The closest two of the first `steps` fire times of `cron` (UTC), in seconds."""
    walk = croniter(cron, datetime(2000, 1, 1), second_at_beginning=len(cron.split()) == 6)
    fires = [walk.get_next(datetime) for _ in range(steps)]
    return min((b - a).total_seconds() for a, b in itertools.pairwise(fires))


@pytest.mark.parametrize(
    "cron",
    [
        "* * * * * *",
        "*/10 * * * * *",
        "0,59 0,59 * * * *",
        "58 59 23 * * *",
        "*/5 * * * *",
        "0,1 * * * *",
        "5,50 10,11 * * *",
        "30 0,23 * * *",
        "0 0 * * *",
        "0 0 1,2 * *",
        "0 0 * * 1-5",
        "0 0 0,23 * * 1",
        "10-20/3 7 1,15 * *",
        "0 0 * * 1",
    ],
)
def test_a_crons_shortest_interval_is_its_closest_fire_times(cron: str) -> None:
    assert shortest_interval_s(ScheduleSpec(cron=cron)) == walked_s(cron)


def test_an_interval_schedule_is_its_every_s() -> None:
    assert shortest_interval_s(ScheduleSpec(every_s=2.5)) == 2.5
    assert shortest_interval_s(ScheduleSpec(cron="0 0 29 2 *")) == 1461 * 86400  # leap days


def test_a_tenants_own_limits_beat_the_deployments_defaults() -> None:
    settings = Settings(tenant_max_pending=7, tenant_max_queues=3)
    defaults = Effective.of(Limits(), settings)
    assert (defaults.max_pending, defaults.max_queues) == (7, 3)
    assert defaults.max_payload_bytes == settings.max_payload_bytes
    own = Effective.of(Limits(max_pending=100, min_interval_s=60), settings)
    assert (own.max_pending, own.max_queues, own.min_interval_s) == (100, 3, 60)
    with pytest.raises(ConfigError, match="tenant_max_schedules"):
        Settings(tenant_max_schedules=0)
    with pytest.raises(ConfigError, match="storage_guard_ratio"):
        Settings(storage_guard_ratio=1.5)


def test_stored_limits_from_another_version_are_read() -> None:
    assert Limits.from_json({"max_pending": 5, "some_later_limit": 1}) == Limits(max_pending=5)
    assert Limits(max_queues=4).stored() == {"max_queues": 4}


def test_refusals_name_the_limit_at_the_edge() -> None:
    limits = Effective.of(
        Limits(max_pending=2, max_payload_total_bytes=10, max_queues=1, max_schedules=1),
        Settings(),
    )
    held = Usage(1, 6, 1, {"a": 2})
    assert over(limits, held, runs_of(['"x"'], ["a"])) is None  # to the limit exactly
    pending = over(limits, held, runs_of(['"x"', "1"], ["a", "a"]))
    assert pending is not None and pending.field == "max_pending" and pending.retry_after_s == 1
    assert getattr(over(limits, held, runs_of(['"xxxx"'], ["a"])), "field", None) == (
        "max_payload_total_bytes"
    )
    assert getattr(over(limits, held, runs_of(["1"], ["b"])), "field", None) == "max_queues"
    moved = Usage(0, 0, 0, {"b": 1, "a": -2})  # leaves a free: still one queue
    assert over(limits, held, moved) is None
    schedules = over(limits, held, Usage(0, 1, 1, {"a": 1}))
    assert schedules is not None and schedules.field == "max_schedules"
    assert schedules.retry_after_s is None  # only a delete frees it
    assert over(limits, held, Usage(-1, -3, 0, {"a": -1})) is None  # freeing is never refused


def test_the_storage_guard_reads_used_memory_as_maxmemory_does() -> None:
    info = {"used_memory": 1000, "mem_not_counted_for_evict": 100, "maxmemory": 1000}
    at_90 = reading_of("n", info, Settings())
    assert (at_90.used_bytes, at_90.ceiling_bytes, at_90.full) == (900, 1000, True)
    below = reading_of("n", {**info, "used_memory": 999}, Settings())
    assert not below.full
    lower = reading_of("n", info, Settings(storage_max_bytes=500))
    assert (lower.ceiling_bytes, lower.full) == (500, True)
    unbounded = reading_of("n", {**info, "maxmemory": 0}, Settings())
    assert (unbounded.ceiling_bytes, unbounded.full) == (0, False)
    own_only = reading_of("n", {**info, "maxmemory": 0}, Settings(storage_max_bytes=2000))
    assert (own_only.ceiling_bytes, own_only.full) == (2000, False)


def test_a_split_shares_the_room_and_never_adds_up_past_it() -> None:
    assert split(10, [0, 0, 0, 0]) == [3, 3, 2, 2]
    assert split(0, [0, 0]) == [0, 0]
    # A shard past its share (runs from a smaller spread) keeps its share, so it refuses,
    # and what it holds past it comes off the others.
    assert split(12, [4, 0, 0, 0]) == [3, 3, 3, 2]
    assert split(12, [0, 0, 0, 9]) == [1, 1, 1, 3]
    for room in range(0, 30):
        for held in itertools.product(range(0, 12), repeat=3):
            caps = split(room, list(held))
            shares = split(room, [0, 0, 0])
            assert all(c <= s for c, s in zip(caps, shares, strict=True))
            # What the shards can come to hold: each up to its cap, or what it holds past it.
            assert sum(max(c, h) for c, h in zip(caps, held, strict=True)) <= max(room, sum(held))
