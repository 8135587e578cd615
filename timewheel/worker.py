"""Executor side: read a (tenant, queue) across the tenant's shards with a consumer group, ack.

This is the minimal reader of the core engine. Retries, leases and dead letters build on
it (DESIGN.md section 6).
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from redis.exceptions import RedisError, ResponseError

from timewheel.engine import Engine, validate_name
from timewheel.errors import RedisUnavailable
from timewheel.models import Delivery

DEFAULT_GROUP = "timewheel"

Handler = Callable[[Delivery], Awaitable[None]]


def _text(value: bytes | None) -> str:
    return "" if value is None else value.decode()


def parse_entry(stream: str, entry_id: bytes, fields: dict[bytes, bytes]) -> Delivery:
    """A Delivery from one ready-stream entry (the envelope of DESIGN.md section 6)."""
    schedule = fields.get(b"schedule_id")
    return Delivery(
        stream=stream,
        entry_id=entry_id.decode(),
        run_id=_text(fields.get(b"run_id")),
        task_id=_text(fields.get(b"task_id")),
        schedule_id=schedule.decode() if schedule else None,
        tenant=_text(fields.get(b"tenant")),
        queue=_text(fields.get(b"queue")),
        attempt=int(fields.get(b"attempt", b"0")),
        due_ms=int(fields.get(b"due_ms", b"0")),
        dispatched_ms=int(fields.get(b"dispatched_ms", b"0")),
        payload_json=_text(fields.get(b"payload")),
    )


class Worker:
    """Reads one tenant's queue from every shard stream of that tenant, as one consumer."""

    def __init__(
        self,
        engine: Engine,
        tenant: str,
        queue: str,
        *,
        group: str = DEFAULT_GROUP,
        consumer: str | None = None,
    ) -> None:
        self.engine = engine
        self.tenant = validate_name(tenant, "tenant")
        self.queue = validate_name(queue, "queue")
        self.group = group
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}"
        self.streams = [engine.keys.stream(s, tenant, queue) for s in engine.shards_of(tenant)]
        self._groups_ready = False

    async def ensure_groups(self) -> None:
        """Create the consumer group on each stream (from the start, so nothing is missed)."""
        for stream in self.streams:
            try:
                await self.engine.client.xgroup_create(stream, self.group, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise RedisUnavailable(f"cannot create group on {stream}: {exc}") from exc
        self._groups_ready = True

    async def read(self, count: int = 100, block_ms: int = 1000) -> list[Delivery]:
        """New deliveries for this consumer, waiting up to block_ms when there are none."""
        if not self._groups_ready:
            await self.ensure_groups()
        try:
            if self.engine.is_cluster and len(self.streams) > 1:
                # Cluster: one call per shard (each stream may live on another node).
                replies = await asyncio.gather(
                    *(self._read_one({s: ">"}, count, block_ms) for s in self.streams)
                )
                raw = [item for reply in replies for item in reply]
            else:
                raw = await self._read_one({s: ">" for s in self.streams}, count, block_ms)
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"read failed: {exc}") from exc
        out: list[Delivery] = []
        for stream_name, entries in raw:
            stream = stream_name.decode() if isinstance(stream_name, bytes) else stream_name
            out.extend(parse_entry(stream, eid, fields) for eid, fields in entries)
        return out

    async def _read_one(self, streams: dict[str, str], count: int, block_ms: int) -> list[Any]:
        wanted: dict[Any, Any] = dict(streams)
        reply = await self.engine.client.xreadgroup(
            self.group, self.consumer, wanted, count=count, block=block_ms
        )
        if isinstance(reply, dict):  # RESP3 shape
            return list(reply.items())
        return list(reply or [])

    async def ack(self, delivery: Delivery) -> bool:
        """Mark a delivery done (state succeeded). False if the run had moved on."""
        return await self.engine.ack(delivery, self.group)

    async def run(self, handler: Handler, stop: asyncio.Event, *, count: int = 100) -> int:
        """Handle deliveries until `stop` is set; acks each one its handler returns from."""
        handled = 0
        while not stop.is_set():
            for delivery in await self.read(count=count, block_ms=500):
                await handler(delivery)
                await self.ack(delivery)
                handled += 1
        return handled
