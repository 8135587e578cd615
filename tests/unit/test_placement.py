"""How a tenant's shards are chosen and read back from its record."""

from __future__ import annotations

from timewheel import ids
from timewheel.config import Settings
from timewheel.store import placement

SETTINGS = Settings(prefix="u", shards=16, default_spread=1)


def test_standalone_spreads_are_consecutive_and_nested() -> None:
    for n in range(1, 17):
        chosen = placement.choose("acme", n, 16)
        assert list(chosen) == ids.tenant_shards("acme", n, 16)
        assert chosen[: n - 1] == placement.choose("acme", n - 1, 16)[: n - 1]
    assert placement.choose("acme", 99, 16) == placement.choose("acme", 16, 16)


def test_cluster_spreads_go_round_robin_over_primaries() -> None:
    def primary_of(shard: int) -> str:  # three primaries, contiguous ranges of shards
        return "abc"[min(shard // 6, 2)]

    base = placement.choose("acme", 1, 16)[0]
    for n in range(1, 17):
        chosen = placement.choose("acme", n, 16, primary_of)
        assert len(set(chosen)) == n and chosen[0] == base
        assert len({primary_of(s) for s in chosen}) == min(n, 3)
        assert chosen[:-1] == placement.choose("acme", n - 1, 16, primary_of)[: n - 1]


def test_a_record_without_shards_has_the_default_placement() -> None:
    default = placement.default("acme", SETTINGS)
    assert placement.from_record("acme", None, SETTINGS) == default
    assert placement.from_record("acme", {"limits": {}, "created_ms": 1}, SETTINGS) == default


def test_a_record_s_union_always_holds_its_list_and_the_default() -> None:
    base = placement.default("acme", SETTINGS).shards[0]
    data = {"shards": [3, 4, 99, "x", True], "shards_used": [7, 3, -1]}
    got = placement.from_record("acme", data, SETTINGS)
    assert got.shards == (3, 4)  # what is not a shard here is left out
    assert got.used == tuple(dict.fromkeys([7, 3, base, 4]))
    assert all(got.shard_for(ids.new_token()) in (3, 4) for _ in range(50))


def test_changing_the_spread_keeps_every_shard_used_in_first_use_order() -> None:
    data: dict[str, object] = {"limits": {}, "created_ms": 1}
    data.update(placement.changed("acme", data, 4, SETTINGS, client=None))
    four = list(placement.choose("acme", 4, 16))
    assert data["shards"] == four and data["shards_used"] == four
    data.update(placement.changed("acme", data, None, SETTINGS, client=None))
    assert data["shards"] == four[:1] and data["shards_used"] == four


def test_a_batch_of_tokens_takes_turns_over_the_shards() -> None:
    spread = placement.Placement((5, 6, 7, 8), (5, 6, 7, 8))
    for count in (1, 3, 4, 10, 41):
        tokens = spread.spread_tokens(count, ids.new_token)
        shards = [spread.shard_for(t) for t in tokens]
        per = [shards.count(s) for s in spread.shards]
        assert len(tokens) == count == sum(per) and max(per) - min(per) <= 1
    one = placement.Placement((3,), (3,))
    assert {one.shard_for(t) for t in one.spread_tokens(5, ids.new_token)} == {3}
