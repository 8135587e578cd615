"""Tenant patterns: a worker that serves every registered tenant a pattern matches.

A tenant given to a worker (`--tenant`, or the tenant of a pair given to `Worker`) that
holds `*`, `?` or `[` is a pattern over the tenant registry (`<prefix>:tenants`: the
tenants made with `timewheel tenant create` or `POST /v1/tenants`), in glob syntax, case
sensitive: `*` any characters, `?` one, `[abc]` or `[a-c]` one of them, `[!abc]` one not
among them. A tenant name holds none of these, so a name and a pattern never mean the
same. `*` serves every registered tenant.

The worker matches its patterns when it starts and again every TENANTS_REFRESH_S, and
serves each tenant registered meanwhile from then on (its consumer group made on each of
its streams from the stream's start, so runs dispatched before are not missed). A
tenant once served stays served while the worker runs (tenants are not deleted).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence

from redis.exceptions import RedisError

from timewheel.errors import RedisUnavailable, ValidationError
from timewheel.ids import validate_name
from timewheel.store.shard import Store

TENANTS_REFRESH_S = 10.0
"""How often a worker with tenant patterns reads the tenant registry again (a tenant
registered while it runs is served within about this long)."""
SCAN_COUNT = 1000
"""Tenants per HSCAN step of the registry."""

_WILD = frozenset("*?[")
_PATTERN = re.compile(r"^[A-Za-z0-9_.\-*?\[\]!]{1,64}$")


def is_pattern(tenant: str) -> bool:
    """Whether a tenant given to a worker is a pattern (it holds `*`, `?` or `[`)."""
    return not _WILD.isdisjoint(tenant)


def tenant_or_pattern(value: object) -> str:
    """A tenant name, or a pattern of them.

    Raises:
        ValidationError: neither (field `tenant`).
    """
    if isinstance(value, str) and is_pattern(value):
        if not _PATTERN.match(value):
            raise ValidationError(
                "a tenant pattern must be 1-64 characters of A-Z a-z 0-9 _ . - and the "
                f"wildcards * ? [ ] ! (got {value!r})",
                field="tenant",
            )
        return value
    return validate_name(value, "tenant")


def matching(tenants: Iterable[str], patterns: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """The (tenant, queue) pairs the patterns give for these tenants: each pattern's
    matches in name order, the patterns in their order, without repeats."""
    names = sorted(set(tenants))
    out: dict[tuple[str, str], None] = {}
    for pattern, queue in patterns:
        match = re.compile(fnmatch.translate(pattern)).match
        out.update(((name, queue), None) for name in names if match(name))
    return list(out)


async def registered_tenants(store: Store) -> list[str]:
    """Every tenant in the registry (an HSCAN walk).

    Raises:
        RedisUnavailable: the registry could not be read.
    """
    names: list[str] = []
    try:
        async for name, _ in store.client.hscan_iter(store.keys.tenants(), count=SCAN_COUNT):
            names.append(name.decode() if isinstance(name, bytes) else str(name))
    except (RedisError, OSError) as exc:
        raise RedisUnavailable(f"tenant registry: {exc}") from exc
    return names
