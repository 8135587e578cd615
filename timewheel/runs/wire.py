"""A worker's two hot calls on a standalone Redis, packed and parsed in bulk.

A worker reads and acknowledges every run, so it skips redis-py's layers per command
and per reply, which cost more than the rest of a run's bookkeeping: XREADGROUP is one
command packed by hiredis, its reply decoded by position (runs/delivery.py), and a batch
of acks is one run_ack call per shard, packed by hiredis and sent as one pipeline, its
replies taken from the connection's hiredis reader in one loop. Connections come from
the client's pool, as in store/pipeline.py, and are kept while the worker runs. On a
Cluster the worker uses the ordinary calls instead.

The Lua functions are the same ones `Outcomes` calls; an ack the server refuses because
it lacks the library (a new or emptied server) goes through `Outcomes.ack_many`, which
loads it and sends the call again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import hiredis
import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from timewheel.errors import RedisUnavailable
from timewheel.runs.delivery import Delivery, parse_fields
from timewheel.runs.outcomes import ACKED, Outcomes, by_shard, report_keys
from timewheel.store.connection import SOCKET_TIMEOUT_S, demoted
from timewheel.store.deadlines import Deadlines
from timewheel.store.library import is_missing_function

try:  # the end-of-buffer marker of redis-py's hiredis parser (redis-py >= 5)
    from redis._parsers.hiredis import NOT_ENOUGH_DATA
except ImportError:  # pragma: no cover - other versions: per-reply reads below
    NOT_ENOUGH_DATA = object()


class Wire:
    """XREADGROUP and run_ack pipelines of one consumer, on a standalone client."""

    def __init__(self, client: aioredis.Redis, outcomes: Outcomes, group: str, consumer: str):
        self.pool = client.connection_pool
        self.outcomes = outcomes
        self.group = group
        self.consumer = consumer
        self._function = outcomes.store.scripts.run_ack.function.encode()
        self.keep = False
        """Keep connections between calls (while the worker runs), until `close`."""
        self._held: list[Any] = []
        """The connections taken from the pool (at most one per call in flight)."""
        self._idle: list[Any] = []
        self._ack_heads: dict[int, list[Any]] = {}
        """Per shard: a run_ack call's event log key, group and shared arguments."""
        self._deadlines = Deadlines(SOCKET_TIMEOUT_S)

    async def read(
        self, count: int, streams: Sequence[str], block_ms: int | None
    ) -> list[tuple[str, list[Delivery]]]:
        """XREADGROUP >: (stream, deliveries) for each stream that had entries."""
        args: list[Any] = ["XREADGROUP", "GROUP", self.group, self.consumer, "COUNT", count]
        if block_ms is not None:
            args += ["BLOCK", block_ms]
        args += ["STREAMS", *streams, *([">"] * len(streams))]
        [reply] = await self._exchange(hiredis.pack_command(tuple(args)), 1, block_ms)
        if isinstance(reply, ResponseError):
            raise RedisUnavailable(f"read failed: {reply}")
        if not reply:
            return []
        items = reply.items() if isinstance(reply, dict) else reply  # RESP3 map, RESP2 array
        out: list[tuple[str, list[Delivery]]] = []
        for name, entries in items:
            if entries:
                stream = name.decode()
                out.append((stream, [parse_fields(stream, eid, f) for eid, f in entries]))
        return out

    def _ack_head(self, shard: int) -> list[Any]:
        """A run_ack call's arguments on a shard before its streams' keys count."""
        head = self._ack_heads.get(shard)
        if head is None:
            store = self.outcomes.store
            head = [store.keys.events(shard), self.group, *store.shared(shard, None)]
            self._ack_heads[shard] = head
        return head

    async def ack_many(self, deliveries: Sequence[Delivery]) -> list[bool]:
        """Acks of many deliveries: one run_ack call per shard, all in one pipeline; True
        acked, False stale or gone."""
        groups = by_shard(deliveries, self.outcomes.store.keys.shard_of_key)
        chunks: list[bytes] = []
        for shard, positions in groups:
            events, *args = self._ack_head(shard)
            keys, where = report_keys(events, deliveries, positions)
            for i, n in zip(positions, where, strict=True):
                d = deliveries[i]
                args += [n, d.entry_id, d.run_id, d.attempt]
            chunks.append(hiredis.pack_command((b"FCALL", self._function, len(keys), *keys, *args)))
        replies = await self._exchange(b"".join(chunks), len(chunks), None)
        answers = [False] * len(deliveries)
        missing: list[int] = []
        for (_, positions), reply in zip(groups, replies, strict=True):
            if isinstance(reply, list):
                for i, code in zip(positions, reply, strict=True):
                    answers[i] = int(code) == ACKED
                continue
            if not is_missing_function(reply):
                raise RedisUnavailable(f"run_ack failed: {reply}")
            missing += positions
        if missing:  # the server lacks the library: the ordinary path loads it
            again = await self.outcomes.ack_many([deliveries[i] for i in missing], self.group)
            for i, answer in zip(missing, again, strict=True):
                answers[i] = answer
        return answers

    async def _exchange(self, packed: bytes, replies: int, block_ms: int | None) -> list[Any]:
        """Send packed commands on a connection of this wire's and read their replies
        (error replies are returned). A connection that failed halfway, or whose server
        answered READONLY, is closed: it connects again on its next use."""
        conn = self._idle.pop() if self._idle else await self._checkout()
        try:
            await conn.send_packed_command(packed, check_health=False)
            if block_ms is not None or replies == 1:
                # One reply: the connection's own read, whose timeout covers a BLOCK.
                try:
                    out = [await conn.read_response()]
                except ResponseError as exc:
                    out = [exc]
            else:
                out = await _read_replies(conn, replies, self._deadlines)
            if demoted(out):  # a primary Sentinel demoted: connect again to the new one
                await conn.disconnect()
            return out
        except (RedisError, OSError) as exc:
            await conn.disconnect()
            raise RedisUnavailable(f"Redis call failed: {exc}") from exc
        except BaseException:
            await conn.disconnect()  # replies may be left unread
            raise
        finally:
            if self.keep:
                self._idle.append(conn)
            else:
                self._held.remove(conn)
                await self.pool.release(conn)

    async def _checkout(self) -> Any:
        """One more connection from the pool, kept until `close` (taking one from the
        pool and giving it back costs more than the calls it would carry)."""
        conn = await self.pool.get_connection()  # type: ignore[no-untyped-call]
        self._held.append(conn)
        return conn

    async def close(self) -> None:
        """Give the connections back to the pool (and keep none from now on)."""
        self.keep = False
        held, self._held, self._idle = self._held, [], []
        for conn in held:
            await self.pool.release(conn)


async def _read_replies(conn: Any, count: int, deadlines: Deadlines) -> list[Any]:
    """`count` replies, taken from the hiredis reader of redis-py's parser while it holds
    whole ones (the parser's own read_response costs more per reply than the reply),
    within one deadline of SOCKET_TIMEOUT_S for them all."""
    parser = getattr(conn, "_parser", None)
    reader = getattr(parser, "_reader", None)
    read_more = getattr(parser, "read_from_socket", None)
    if not isinstance(reader, hiredis.Reader) or read_more is None:  # pragma: no cover
        out: list[Any] = []
        for _ in range(count):
            try:
                out.append(await conn.read_response(timeout=math.inf))
            except ResponseError as exc:
                out.append(exc)
        return out
    out = []
    gets = reader.gets
    with deadlines:
        while len(out) < count:
            reply = gets()
            if reply is NOT_ENOUGH_DATA or reply is False:
                await read_more()
            else:
                out.append(reply)
    return out
