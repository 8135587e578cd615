"""Tenant patterns of a worker (runs/patterns.py): what is a pattern, what it matches,
and what is refused, before any server is reached."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from timewheel.config import Settings
from timewheel.errors import ValidationError
from timewheel.runs.patterns import is_pattern, matching, tenant_or_pattern
from timewheel.runs.worker import Worker
from timewheel.store.shard import Store

TENANTS = ["acme", "acme-eu", "acme-us", "acme.eu", "Acme-EU", "globex", "acmeX"]


@pytest.mark.parametrize(
    ("pattern", "matched"),
    [
        ("acme-*", ["acme-eu", "acme-us"]),
        ("acme*", ["acme", "acme-eu", "acme-us", "acme.eu", "acmeX"]),
        ("acme?eu", ["acme-eu", "acme.eu"]),  # '.' is a plain character, '?' one of any
        ("acme-[e]?", ["acme-eu"]),
        ("acme-[!e]?", ["acme-us"]),
        ("[A-Z]*", ["Acme-EU"]),  # case-sensitive
        ("*", sorted(TENANTS)),
        ("nothing-*", []),
    ],
)
def test_a_pattern_matches_as_a_glob(pattern: str, matched: list[str]) -> None:
    assert is_pattern(pattern)
    assert matching(TENANTS, [(pattern, "q")]) == [(t, "q") for t in matched]


def test_patterns_keep_their_order_without_repeats() -> None:
    found = matching(TENANTS, [("glob*", "a"), ("acme-*", "a"), ("*-eu", "a"), ("acme-*", "b")])
    assert found == [
        ("globex", "a"),
        ("acme-eu", "a"),
        ("acme-us", "a"),  # '*-eu' adds no second ('acme-eu', 'a')
        ("acme-eu", "b"),
        ("acme-us", "b"),
    ]


@pytest.mark.parametrize("name", ["acme", "acme-eu", "a.b_c", "x" * 64])
def test_a_name_is_no_pattern(name: str) -> None:
    assert not is_pattern(name)
    assert tenant_or_pattern(name) == name


@pytest.mark.parametrize(
    "bad", ["acme *", "acme/*", "*" * 65, "", "bad name", "x" * 65, 7, None, "é*"]
)
def test_a_malformed_tenant_or_pattern_is_refused(bad: object) -> None:
    with pytest.raises(ValidationError) as err:
        tenant_or_pattern(bad)
    assert err.value.field == "tenant"


def _store() -> Store:
    return Store(aioredis.Redis(), Settings(prefix="u", shards=16, default_spread=2))


def test_a_worker_keeps_named_pairs_and_patterns_apart() -> None:
    worker = Worker(_store(), pairs=[("acme-*", "hooks"), ("globex", "hooks"), ("acme-*", "hooks")])
    assert worker.pairs == [("globex", "hooks")]
    assert worker.patterns == [("acme-*", "hooks")]
    assert (worker.tenant, worker.queue) == ("globex", "hooks")
    assert len(worker.streams) == 2  # globex's two shards; the pattern's come once matched
    only = Worker(_store(), "*", "default")
    assert (only.pairs, only.streams, only.tenant) == ([], [], "*")


def test_a_worker_refuses_a_malformed_pattern() -> None:
    with pytest.raises(ValidationError) as err:
        Worker(_store(), "acme *", "default")
    assert err.value.field == "tenant"
