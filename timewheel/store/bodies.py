"""Body hashes that split: where a run's record lives in its shard, as lua/lib/bodies.lua
places it (docs/design.md, "Body hashes that split").

A shard's records spread over body hashes by the low bits of the task id's token, by
linear hashing: the shard's meta holds `body_bits` (L) and `body_split` (s). A task whose
low L bits v are at least s is in hash (L, v), otherwise in (L + 1, its low L + 1 bits).
Hash (10, v) is named ``t:<two characters>`` (every shard's 1,024 hashes before hashes
split, and a shard whose meta has no body_bits), any other ``t<level>:<characters>``.
A record's field is the run id less its 3 shard characters and the last floor(level / 5)
characters of the task id, which the name implies.

Readers walk a shard's hashes by *position* (0 .. 2^20): the token's low 20 bits read
backwards. A hash holds one run of positions, and a split gives that run to its two
children in order, so a walk's cursor between two hashes stays good while hashes split.
A walk that reads several hashes in one round trip reads the layout after them in the
same round trip: a layout changed since the one it walked by means a split moved
records meanwhile, and the round is read again (`stale`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from timewheel.ids import ALPHABET

LEGACY_BITS = 10
"""The level of a shard whose meta has no body_bits: 1,024 hashes ``t:<xy>``."""
MAX_BITS = 20
"""Four characters of the token: 2^20 hashes at most."""
WALK_END = 1 << MAX_BITS
"""The position after the last: a walk is done."""
META_FIELDS = ("body_bits", "body_split")
"""What to HMGET from a shard's meta for its layout (`BodyLayout.read`)."""

_VALUE = {c: i for i, c in enumerate(ALPHABET)}


def _name(level: int, v: int) -> str:
    """The name of hash (level, v) after the shard's tag."""
    chars = []
    for _ in range(-(-level // 5)):
        chars.append(ALPHABET[v % 32])
        v //= 32
    text = "".join(reversed(chars))
    return f"t:{text}" if level == LEGACY_BITS else f"t{level}:{text}"


def _low_bits(task_id: str) -> int:
    """The token's low 20 bits (a character off the alphabet reads 0, as in Lua)."""
    x = 0
    for c in task_id[-4:]:
        x = x * 32 + _VALUE.get(c, 0)
    return x


def _reverse(x: int) -> int:
    """Bits 0 .. 19 of x in reverse order."""
    return int(f"{x:020b}"[::-1], 2)


def position_of(run_id: str) -> int:
    """The walk position of a run: its task's token's low 20 bits read backwards."""
    return _reverse(_low_bits(run_id.partition("@")[0]))


@dataclass(frozen=True, slots=True)
class BodyHash:
    """One body hash met on a walk: its key, the characters its fields leave out, the
    position it starts at and the one the next hash starts at."""

    key: str
    dropped: str
    position: int
    next_position: int

    def run_id(self, shard: int, field: str) -> str:
        """The run id of one of its fields."""
        middle, at, rest = field.partition("@")
        return f"{shard:03x}{middle}{self.dropped}{at}{rest}"


@dataclass(frozen=True, slots=True)
class BodyLayout:
    """A shard's body layout: level `bits`, the hashes below `split` split once more."""

    bits: int = LEGACY_BITS
    split: int = 0

    @classmethod
    def read(cls, values: Sequence[Any]) -> BodyLayout:
        """From HMGET meta body_bits body_split (absent: the layout of earlier versions)."""
        bits, split = values[0], values[1]
        if bits is None:
            return cls()
        return cls(int(bits), int(split or 0))

    def _hash(self, x: int) -> tuple[int, int]:
        level = self.bits
        v = x % (1 << level)
        if v < self.split:
            level += 1
            v = x % (1 << level)
        return level, v

    def place(self, tag: str, run_id: str) -> tuple[str, str]:
        """(key, field) of a run's record in the shard whose key prefix is `tag`."""
        task_id, at, rest = run_id.partition("@")
        level, v = self._hash(_low_bits(task_id))
        field = task_id[3 : len(task_id) - level // 5] + at + rest
        return tag + _name(level, v), field

    def at(self, tag: str, position: int) -> BodyHash:
        """The hash holding `position` of the walk (module doc)."""
        level, v = self._hash(_reverse(position))
        name = _name(level, v)
        keep = level // 5
        span = 1 << (MAX_BITS - level)
        start = position - position % span
        return BodyHash(tag + name, name[-keep:] if keep else "", start, start + span)

    def walk(self, tag: str, position: int = 0) -> Iterator[BodyHash]:
        """The hashes from the one holding `position` on, in walk order."""
        while position < WALK_END:
            h = self.at(tag, position)
            yield h
            position = h.next_position
