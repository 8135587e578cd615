"""Wake-ups: a create (or update, ack, fail) whose run is due before its shard's next
tick publishes the shard number on the wake channel; schedulers listen and tick it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import structlog
from redis.exceptions import RedisError

from timewheel.store.connection import node_client

log = structlog.get_logger("timewheel.scheduler")


async def listen_for_wakeups(
    redis_url: str, channel: str, wake: Callable[[int], None], stop: asyncio.Event
) -> None:
    """Call `wake(shard)` for every message on `channel` until `stop` is set,
    reconnecting after a failure. A plain connection to the URL's node (PUBLISH reaches
    every node of a Cluster), or to the primary a Sentinel URL names: after a failover
    the connection fails, and the next one goes to the promoted replica."""
    while not stop.is_set():
        client = node_client(redis_url)
        try:
            async with client.pubsub() as pubsub:
                await pubsub.subscribe(channel)
                while not stop.is_set():
                    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if msg and msg.get("type") == "message":
                        with contextlib.suppress(ValueError):
                            wake(int(msg["data"]))
        except (RedisError, OSError) as exc:
            log.warning("wake_listener_failed", error=str(exc))
            await asyncio.sleep(0.5)
        finally:
            await client.aclose()
