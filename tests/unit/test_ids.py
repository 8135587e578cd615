"""Ids: only the canonical spelling of a task, run or schedule id names a record."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from timewheel import ids
from timewheel.types import ms_to_rfc3339

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


def _encode_by_character(value: int) -> str:
    """The token encoding one character at a time (5 bits each, least significant last)."""
    out = []
    for _ in range(ids.TOKEN_CHARS):
        out.append(ids.ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(out))


def test_tokens_encode_as_one_character_per_five_bits() -> None:
    rng = random.Random(7)
    values = [0, 1, 31, 32, 1023, 1024, 2**65 - 1, 2**72 - 1]
    values += [rng.getrandbits(72) for _ in range(2000)]
    for value in values:
        assert ids._encode(value) == _encode_by_character(value)
    assert ids._encode(2**65 - 1) == "z" * 13
    assert ids.RUN_ID.fullmatch(ids.make_task_id(5, ids.new_token()))


def test_times_render_as_rfc3339_milliseconds() -> None:
    rng = random.Random(11)
    stamps = [0, 1, 999, 1000, -1, -1000, 1764650000123, 4102444799999]
    stamps += [rng.randrange(-(10**12), 10**13) for _ in range(2000)]
    for ms in stamps:
        expected = (
            datetime.fromtimestamp(ms // 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
            + f".{ms % 1000:03d}Z"
        )
        assert ms_to_rfc3339(ms) == expected
    assert ms_to_rfc3339(1764650000123) == "2025-12-02T04:33:20.123Z"
