"""Ids: only the canonical spelling of a task, run or schedule id names a record."""

from __future__ import annotations

import pytest

from timewheel import ids

TASK = ids.make_task_id(0x0AB, "yjq3nqgkj1qc5")


@pytest.mark.parametrize(
    ("run_id", "shard"),
    [
        (TASK, 0x0AB),
        (TASK + "@1700000000000", 0x0AB),
        (TASK + "@manual-1700000000000", 0x0AB),
        ("000" + "0" * 13, 0),
        ("fff" + "z" * 13, 0xFFF),
    ],
)
def test_canonical_ids_name_their_shard(run_id: str, shard: int) -> None:
    assert ids.shard_of(run_id) == shard


@pytest.mark.parametrize(
    "alias",
    [
        "+" + TASK[1:],  # int("+ab", 16) is 171
        " " + TASK[1:],  # and so is int(" ab", 16)
        TASK.upper(),
        TASK[:3].upper() + TASK[3:],
        TASK[:-1] + "U",  # not in the alphabet (Crockford base32 has no u)
        TASK + " ",
        TASK + "\n",
        TASK[:-1],
        TASK + "0",
        TASK + "@",
        TASK + "@x",
        TASK + "@-1",
        TASK + "@manual-",
        TASK + "@1@2",
        "",
    ],
)
def test_aliases_name_nothing(alias: str) -> None:
    assert ids.shard_of(alias) is None
