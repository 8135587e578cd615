"""Replica waits: how many replicas a client's write waits for (WAIT) on its primary.

With `min_replicas_ack` n >= 1 (strict), every write waits until n replicas of its
primary have it, within `replica_wait_ms`; fewer in time is ReplicasBehind (HTTP 503,
retry with the same idempotency key). That holds while a primary has no replica at all:
its writes are refused until one attaches.

With -1 (auto, the default), a write waits for one replica on a primary that has one
attached, and is refused the same way when that replica does not confirm in time (a
replica attached but behind). A primary with no replica attached (a replica promoted
after its primary died, until a new replica attaches; or a primary whose replica died)
answers on its own, its AOF holding the write, instead of refusing every write to its
shards until an operator mends replication. Such a primary is found by the first write
whose WAIT falls short (INFO replication then shows no replica), or at connect; from then
on its writes send no WAIT, and it is looked at again every SOLO_RECHECK_S. Writes
answered that way are counted (`unreplicated`, exported by the API as
timewheel_unreplicated_writes_total) and each spell is logged (write_unreplicated, then
write_replicated_again).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import structlog
from redis.exceptions import RedisError

from timewheel.errors import ReplicasBehind
from timewheel.store.connection import RedisClient

log = structlog.get_logger("timewheel.store")

SOLO_RECHECK_S = 2.0
"""How often a primary known to have no replica is looked at again (INFO replication)."""


async def attached_replicas(client: RedisClient, node: Any) -> int | None:
    """The replicas attached to a primary (`node`: a Cluster node, or None for the one
    standalone server); None when it cannot be read."""
    target = {} if node is None else {"target_nodes": node}
    try:
        info = await client.info("replication", **target)
    except (RedisError, OSError):
        return None
    return int(info.get("connected_slaves", 0))


class ReplicaWait:
    """The replica wait of one process's writes (see the module's doc)."""

    def __init__(self, count: int, timeout_ms: int, *, strict: bool) -> None:
        self.count = count
        self.timeout_ms = timeout_ms
        self.strict = strict
        self.unreplicated = 0
        """Writes answered without a replica's confirmation (auto mode, no replica)."""
        self._solo: dict[str, float] = {}
        """Primaries known to have no replica -> when to look again (monotonic)."""

    @property
    def command(self) -> tuple[Any, ...]:
        return ("WAIT", self.count, self.timeout_ms)

    def mark_solo(self, name: str) -> None:
        """Remember that the primary `name` has no replica (at connect, or found so)."""
        if not self.strict:
            self._solo[name] = time.monotonic() + SOLO_RECHECK_S

    async def waits_on(self, client: RedisClient, name: str, node: Any) -> bool:
        """Whether a write on the primary `name` sends a WAIT (False: it answers alone,
        and is counted)."""
        until = self._solo.get(name)
        if until is None:
            return True
        if time.monotonic() >= until:
            replicas = await attached_replicas(client, node)
            if replicas is None or replicas > 0:
                del self._solo[name]
                log.info("write_replicated_again", node=name or "standalone", replicas=replicas)
                return True
            self._solo[name] = time.monotonic() + SOLO_RECHECK_S
        self.unreplicated += 1
        return False

    async def settle(self, client: RedisClient, acks: Mapping[str, tuple[Any, Any]]) -> None:
        """Check what each primary's WAIT answered (`acks`: name -> (node, reply)).

        Raises:
            ReplicasBehind: a primary confirmed fewer replicas than wanted, and has a
                replica attached (or the wait is strict).
        """
        for name, (node, ack) in acks.items():
            if not isinstance(ack, Exception) and int(ack) >= self.count:
                continue
            alone = not self.strict and not isinstance(ack, Exception)
            if alone and await attached_replicas(client, node) == 0:
                self.mark_solo(name)
                self.unreplicated += 1
                log.warning(
                    "write_unreplicated",
                    node=name or "standalone",
                    reason="the primary has no replica attached; its writes are "
                    "answered on its own AOF until one attaches",
                )
                continue
            if isinstance(ack, Exception):
                raise ReplicasBehind(
                    f"the write reached its primary, but its replicas' confirmation could "
                    f"not be read ({ack}); it may still be lost in a failover: retry it "
                    "with the same idempotency key"
                )
            raise ReplicasBehind(
                f"the write reached {ack} of the {self.count} replica(s) it needs within "
                f"{self.timeout_ms} ms; it may still be lost in a failover: retry it with "
                "the same idempotency key"
            )
