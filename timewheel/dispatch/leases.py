"""Shard ownership between scheduler nodes: membership, rendezvous shares, fenced leases.

Why leases although `tick` is atomic: the tick script already makes a double dispatch
impossible even if two nodes tick one shard at once. Leases split the polling work
(each shard is polled every few ms by one node, not by all; Sidekiq's leaderless random
poll is the alternative we rejected for latency) and the fencing epoch keeps ownership
exact for the scripts that need one owner (planner, reaper): every scheduler script
takes (node, epoch) and answers LEASE_LOST once they no longer hold.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from timewheel.store.library import check
from timewheel.store.shard import Call, Store


def rendezvous_owner(shard: int, nodes: Iterable[str]) -> str | None:
    """The node that should own `shard`: highest hash of (node, shard) wins.

    When a node joins or leaves, only the shards it wins or held move.
    """
    best, best_score = None, -1
    for node in nodes:
        score = int.from_bytes(
            hashlib.blake2b(f"{node}\0{shard}".encode(), digest_size=8).digest(), "big"
        )
        if score > best_score:
            best, best_score = node, score
    return best


def share_of(node: str, nodes: Sequence[str], shards: int) -> set[int]:
    """The shards `node` should own among the live `nodes`."""
    return {s for s in range(shards) if rendezvous_owner(s, nodes) == node}


@dataclass(frozen=True, slots=True)
class Membership:
    """The live scheduler nodes, and Redis's time when the heartbeat was written."""

    now_ms: int
    nodes: list[str]


def _members(reply: list[Any]) -> Membership:
    return Membership(int(reply[0]), sorted(n.decode() for n in reply[1:]))


def _epoch(reply: list[Any]) -> int | None:
    return None if int(reply[0]) < 0 else int(reply[0])


def _renewed(reply: list[Any]) -> bool:
    return int(reply[0]) == 1


def _released(shard: int) -> Any:
    def decode(reply: list[Any]) -> bool:
        return int(check(reply, action="release", shard=shard)[0]) == 1

    return decode


class Leases:
    """One node's view of membership and its shard leases (lua/lease_*.lua)."""

    def __init__(self, store: Store, node: str, ttl_ms: int):
        self.store = store
        self.node = node
        self.ttl_ms = ttl_ms

    async def members(self, *, leaving: bool = False) -> list[str]:
        """Mark this node alive (or gone) and return the live nodes (lua/lease_members.lua).
        The reply's Redis time refreshes the store's clock."""
        call = Call(
            self.store.scripts.lease_members,
            [self.store.keys.nodes()],
            [self.node, self.ttl_ms, "1" if leaving else "0"],
            _members,
        )
        sent = self.store.clock.sent()
        membership = await self.store.run(call)
        self.store.clock.observe(membership.now_ms, sent)
        return membership.nodes

    async def acquire(self, shard: int) -> int | None:
        """The fencing epoch if this node now holds `shard`; None if another node does."""
        k = self.store.keys
        call = Call(
            self.store.scripts.lease_acquire,
            [k.lease(shard), k.meta(shard)],
            [self.node, self.ttl_ms],
            _epoch,
        )
        return await self.store.run(call)

    async def renew(self, shard: int, epoch: int) -> bool:
        """True if still held (and extended by ttl); False means the shard is lost."""
        call = Call(
            self.store.scripts.lease_renew,
            [self.store.keys.lease(shard)],
            [self.node, epoch, self.ttl_ms],
            _renewed,
        )
        return await self.store.run(call)

    async def release(self, shard: int, epoch: int) -> bool:
        """Give the shard up at once; False if it was not ours any more."""
        call = Call(
            self.store.scripts.lease_release,
            [self.store.keys.lease(shard)],
            [self.node, epoch],
            _released(shard),
        )
        return await self.store.run(call)


class DutyLease:
    """A lease on a duty one node at a time performs (the continuous auditor), with a
    fencing epoch like a shard's: the same scripts (lua/lease_*.lua) on the duty's own
    keys (one hash tag), so whoever holds it writes only while it still does."""

    def __init__(self, store: Store, node: str, ttl_ms: int, lease_key: str, meta_key: str):
        self.store = store
        self.node = node
        self.ttl_ms = ttl_ms
        self.lease_key = lease_key
        self.meta_key = meta_key

    async def acquire(self) -> int | None:
        """The fencing epoch if this node now holds the duty; None if another node does."""
        s = self.store.scripts
        call = Call(
            s.lease_acquire, [self.lease_key, self.meta_key], [self.node, self.ttl_ms], _epoch
        )
        return await self.store.run(call)

    async def renew(self, epoch: int) -> bool:
        """True if still held (and extended by ttl)."""
        s = self.store.scripts
        call = Call(s.lease_renew, [self.lease_key], [self.node, epoch, self.ttl_ms], _renewed)
        return await self.store.run(call)

    async def release(self, epoch: int) -> bool:
        """Give the duty up at once (graceful shutdown): another node takes it next round."""
        s = self.store.scripts
        call = Call(s.lease_release, [self.lease_key], [self.node, epoch], _released(-1))
        return await self.store.run(call)
