"""Task ids and names: the shard a task lives in is written into its id.

A task id is 3 hex digits of shard number followed by 13 characters of Crockford
base32 (65 bits): 16 characters. The shard prefix lets any process find a task from
its id alone; the last two characters pick its body hash within the shard. An id
derived from (tenant, idempotency key) is a hash of both, so the task record is its
own dedupe record (docs/design.md, the key layout).
"""

from __future__ import annotations

import hashlib
import re
import secrets
import zlib

from timewheel.errors import ValidationError

ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
TOKEN_CHARS = 13
MAX_SHARDS = 4096


_PAIRS = tuple(a + b for a in ALPHABET for b in ALPHABET)
"""Every two-character run of the alphabet, indexed by its 10 bits."""


def _encode(value: int) -> str:
    """The low 65 bits of `value` as 13 characters, most significant first (a table of
    character pairs: a third of a loop's time per character, on every create)."""
    p = _PAIRS
    return "".join(
        (
            ALPHABET[(value >> 60) & 31],
            p[(value >> 50) & 1023],
            p[(value >> 40) & 1023],
            p[(value >> 30) & 1023],
            p[(value >> 20) & 1023],
            p[(value >> 10) & 1023],
            p[value & 1023],
        )
    )


def new_token() -> str:
    """A random 65-bit token."""
    return _encode(secrets.randbits(5 * TOKEN_CHARS))


def idempotent_token(tenant: str, key: str) -> str:
    """A token derived from (tenant, idempotency key): the same pair gives the same token."""
    digest = hashlib.sha256(f"{tenant}\0{key}".encode()).digest()
    return _encode(int.from_bytes(digest[:9], "big"))


def tenant_shards(tenant: str, spread: int, shards: int) -> list[int]:
    """The shards a tenant's tasks are placed in: `spread` consecutive shards from a hash."""
    base = zlib.crc32(tenant.encode())
    return [(base + i) % shards for i in range(min(spread, shards))]


def shard_for(tenant: str, token: str, spread: int, shards: int) -> int:
    """The shard of a task: one of its tenant's shards, chosen by the token."""
    choices = tenant_shards(tenant, spread, shards)
    return choices[zlib.crc32(token.encode()) % len(choices)]


def make_task_id(shard: int, token: str) -> str:
    """Join shard and token into a task id."""
    return f"{shard:03x}{token}"


RUN_ID = re.compile(rf"[0-9a-f]{{3}}[{ALPHABET}]{{{TOKEN_CHARS}}}(?:@(?:manual-)?[0-9]{{1,20}})?")
"""A task id (3 lowercase hex digits of shard, then the token), optionally followed by
'@<fire ms>' or '@manual-<ms>' for a schedule's run. Nothing else names a record: an
alias (upper case, a sign, spaces) would reach the same shard but not the same key."""


def shard_of(task_id: str) -> int | None:
    """The shard written in a task, run or schedule id, or None if the id is not exactly
    one of ours (no Redis call is needed to refuse it)."""
    if not RUN_ID.fullmatch(task_id):
        return None
    return int(task_id[:3], 16)


NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
"""A tenant or queue name: they go into key names."""


def validate_name(value: object, field_name: str) -> str:
    """A tenant or queue name: 1-64 of letters, digits, '_', '.', '-' (they go into keys).

    Raises:
        ValidationError: anything else, naming `field_name`.
    """
    if not isinstance(value, str) or not NAME.match(value):
        raise ValidationError(
            f"{field_name} must be 1-64 characters of A-Z a-z 0-9 _ . - (got {value!r})",
            field=field_name,
        )
    return value
