"""Rendezvous hashing of shards over scheduler nodes: one owner per shard, fair shares,
little movement when a node joins."""

from __future__ import annotations

from timewheel.dispatch.leases import rendezvous_owner, share_of


def test_rendezvous_gives_every_shard_one_owner_and_moves_little() -> None:
    nodes = ["node-a", "node-b", "node-c"]
    shares = [share_of(n, nodes, 64) for n in nodes]
    assert set().union(*shares) == set(range(64))
    assert sum(len(s) for s in shares) == 64
    assert all(10 <= len(s) <= 32 for s in shares), [len(s) for s in shares]
    # A fourth node takes shards only from the others; nothing moves between the three.
    moved = [
        s
        for s in range(64)
        if rendezvous_owner(s, nodes) != rendezvous_owner(s, [*nodes, "node-d"])
    ]
    assert all(rendezvous_owner(s, [*nodes, "node-d"]) == "node-d" for s in moved)
    assert 5 <= len(moved) <= 30
    assert rendezvous_owner(3, []) is None
