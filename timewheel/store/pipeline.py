"""Pipelines of script calls: one round trip for many; a server without the library
gets it loaded and the calls it refused sent again.

On standalone Redis the commands are packed by hiredis and sent on one connection of a
`Lane` (connections kept out of the client's pool between calls) or, without one, on one
pooled connection; on Cluster redis-py's cluster pipeline splits them per node.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Coroutine, Sequence
from typing import Any, Protocol, cast

import hiredis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ConnectionError, ResponseError

from timewheel.errors import RedisUnavailable
from timewheel.store.connection import (
    SOCKET_TIMEOUT_S,
    TORN,
    UNREACHABLE,
    RedisClient,
    demoted,
    torn_connection,
)
from timewheel.store.deadlines import Deadlines
from timewheel.store.library import Script, ScriptArg, is_missing_function
from timewheel.store.replication import ReplicaWait

try:  # the end-of-buffer marker of redis-py's hiredis parser (redis-py >= 5)
    from redis._parsers.hiredis import NOT_ENOUGH_DATA
except ImportError:  # pragma: no cover - other versions: a marker nothing equals
    NOT_ENOUGH_DATA = object()


class Lane:
    """Packed exchanges on a standalone client's connections, kept between calls.

    redis-py's way through one command costs more than Redis's work on a create: the
    pool's checkout (a lock, and a probe of the socket for stray data), packing in
    Python, a task per send for its timeout, and a timeout context per reply. A lane
    takes a connection from the pool once and keeps it (at most `keep` idle ones; more
    concurrent callers take more and give the extra back), writes hiredis-packed bytes
    straight to it, and takes the replies from its hiredis reader, under one deadline.

    A kept connection that the server closed meanwhile (a restart) has seen its end of
    stream while idle: it is reconnected before use, as the pool's probe would. A
    connection that fails halfway is closed (its replies may be left unread); the next
    use connects it again. So is one whose server answered READONLY (a primary demoted
    by Sentinel): on a Sentinel URL it connects again to the promoted replica. An exchange
    that gets no reply within SOCKET_TIMEOUT_S (checked once a second: store/deadlines.py)
    raises TimeoutError.
    """

    def __init__(self, client: aioredis.Redis, *, keep: int = 4):
        self.pool = client.connection_pool
        self.keep = keep
        self._idle: list[Any] = []
        self._deadlines = Deadlines(SOCKET_TIMEOUT_S)
        self._heads: dict[tuple[Any, ...], bytes] = {}
        """Packed FCALL heads (pack): the command, KEYS and the repeating ARGV values."""

    async def exchange(self, packed: bytes, count: int) -> list[Any]:
        """Send packed commands and read their `count` replies; error replies are
        returned, not raised.

        Raises:
            RedisError, OSError: the connection failed (it is closed).
        """
        conn = self._idle.pop() if self._idle else await self._checkout()
        try:
            reader = conn._reader
            if reader is None or reader.at_eof() or reader.exception() is not None:
                await conn.disconnect()  # closed while idle: connect it again
            if not conn.is_connected:
                await conn.connect()
            writer, parser = conn._writer, conn._parser
            gets, read_more = parser._reader.gets, parser.read_from_socket
            with self._deadlines:
                try:
                    writer.write(packed)
                    if writer.transport.get_write_buffer_size():  # else nothing to wait for
                        await writer.drain()
                except RuntimeError as exc:  # uvloop: the transport was closed under it
                    raise ConnectionError(f"Error while writing to Redis: {exc}") from exc
                out: list[Any] = []
                while len(out) < count:
                    reply = gets()
                    if reply is NOT_ENOUGH_DATA or reply is False:
                        await read_more()
                    else:
                        out.append(reply)
        except BaseException:
            await conn.disconnect()
            await self._give_back(conn)
            raise
        if demoted(out):
            await conn.disconnect()
        if not self._keep(conn):
            await self.pool.release(conn)
        return out

    def pack(self, call: ScriptCall) -> bytes:
        """The call as RESP bytes, its head (the command, KEYS and its first `head` ARGV
        values, which repeat from call to call) packed once and kept: hiredis formats each
        argument's length with sprintf, some 1,300 instructions an argument."""
        args, head = call.args, call.head
        if not head or head >= len(args):
            return pack_call(call.script, call.keys, args)
        key = (call.script.function, len(args), *call.keys, *args[:head])
        prefix = self._heads.get(key)
        if prefix is None:
            if len(self._heads) >= HEADS_KEPT:
                self._heads.clear()
            packed = pack_call(call.script, call.keys, args[:head])
            count = 3 + len(call.keys) + len(args)
            prefix = b"*%d\r\n" % count + packed[packed.index(b"\r\n") + 2 :]
            self._heads[key] = prefix
        tail: tuple[Any, ...] = tuple(args[head:])
        rest: bytes = hiredis.pack_command(tail)
        return prefix + rest[rest.index(b"\r\n") + 2 :]

    async def _checkout(self) -> Any:
        return await self.pool.get_connection()  # type: ignore[no-untyped-call]

    def _keep(self, conn: Any) -> bool:
        """Keep an idle connection, unless `keep` are kept already (then False)."""
        if len(self._idle) < self.keep:
            self._idle.append(conn)
            return True
        return False

    async def _give_back(self, conn: Any) -> None:
        if not self._keep(conn):
            await self.pool.release(conn)

    async def close(self) -> None:
        """Give the idle connections back to the pool."""
        idle, self._idle = self._idle, []
        for conn in idle:
            await self.pool.release(conn)


HEADS_KEPT = 4096
"""Most packed heads a lane keeps (one per script and shard in use; past it, it starts
over)."""


def pack_call(script: Script, keys: Sequence[str], args: Sequence[ScriptArg]) -> bytes:
    """One FCALL as RESP bytes (hiredis packs in C what redis-py packs in Python)."""
    command: tuple[Any, ...] = ("FCALL", script.function, len(keys), *keys, *args)
    packed: bytes = hiredis.pack_command(command)
    return packed


class ScriptCall(Protocol):
    """What a pipeline sends of a call: the script, its KEYS, its ARGV (store/shard.py)."""

    @property
    def script(self) -> Script: ...

    @property
    def keys(self) -> list[str]: ...

    @property
    def args(self) -> list[ScriptArg]: ...

    @property
    def head(self) -> int: ...


def run_pipeline(
    client: RedisClient,
    calls: Sequence[ScriptCall],
    *,
    replicas: ReplicaWait | None = None,
    lane: Lane | None = None,
) -> Coroutine[Any, Any, list[Any]]:
    """Run script calls in one pipeline; calls refused because the server lacks the
    library (a new or emptied server) load it and are sent again.

    Pipelines are not transactions: a call refused that way did not run, so resending
    it alone is safe; every other call ran exactly once.

    replicas: after the calls, WAIT on each connection that carried them (WAIT counts
    the writes of its own connection) until the replicas wanted have them
    (store/replication.py: a primary known to have none gets no WAIT in auto mode).
    lane: on standalone Redis, the connections to send on (else one from the pool).

    Raises:
        RedisUnavailable: Redis failed; ReplicasBehind: the writes ran, but fewer than n
            replicas confirmed them in time.
    """
    if lane is not None and replicas is None and len(calls) == 1:
        # One call on a lane (a single create): without the pipeline's bookkeeping, and
        # the caller awaits it straight (this is no coroutine of its own). A lane is a
        # standalone client's (cast: isinstance against RedisCluster costs).
        return _run_on_lane(cast(aioredis.Redis, client), calls[0], lane)
    return _run_pipeline(client, calls, replicas, lane)


async def _run_pipeline(
    client: RedisClient,
    calls: Sequence[ScriptCall],
    replicas: ReplicaWait | None,
    lane: Lane | None,
) -> list[Any]:
    replies: list[Any] = [None] * len(calls)
    todo = list(range(len(calls)))
    for attempt in range(2):
        try:
            results, acks = await _send([calls[i] for i in todo], client, replicas, lane)
        except (*UNREACHABLE, *TORN) as exc:
            if (lost := _unavailable(exc)) is None:
                raise
            raise lost from exc
        missing: list[int] = []
        for i, result in zip(todo, results, strict=True):
            if is_missing_function(result) and attempt == 0:
                missing.append(i)
            elif isinstance(result, Exception):
                raise RedisUnavailable(f"{calls[i].script.name} failed: {result}") from result
            else:
                replies[i] = result
        if replicas is not None and len(missing) < len(todo):
            await replicas.settle(client, acks)  # something was written: it must be replicated
        if not missing:
            break
        libraries = {calls[i].script.library.name: calls[i].script.library for i in missing}
        for library in libraries.values():
            await library.load(client)
        todo = missing
    return replies


async def _run_on_lane(client: aioredis.Redis, call: ScriptCall, lane: Lane) -> list[Any]:
    """One call on a lane, without a pipeline's bookkeeping (a single create's way, some
    15,000 instructions less): run_pipeline's reply and errors for one call with no
    replica wait.

    Raises:
        RedisUnavailable: Redis failed, or answered the call with an error.
    """
    packed = lane.pack(call)
    for attempt in range(2):
        try:
            [reply] = await lane.exchange(packed, 1)
        except (*UNREACHABLE, *TORN) as exc:
            if (lost := _unavailable(exc)) is None:
                raise
            raise lost from exc
        if not isinstance(reply, Exception):
            return [reply]
        if attempt == 1 or not is_missing_function(reply):
            raise RedisUnavailable(f"{call.script.name} failed: {reply}") from reply
        await call.script.library.load(client)  # a new or emptied server: load, send again
    raise AssertionError("unreachable")  # pragma: no cover


def _unavailable(exc: Exception) -> RedisUnavailable | None:
    """What a failed exchange raises: RedisUnavailable for a server down or a connection
    torn under redis-py; None for a TORN error of the caller's own code (raised as is)."""
    if isinstance(exc, UNREACHABLE):
        return RedisUnavailable(f"pipeline failed: {exc}")
    if not torn_connection(exc):
        return None
    return RedisUnavailable(f"pipeline failed: connection lost ({exc})")


async def _send(
    calls: list[ScriptCall],
    client: RedisClient,
    replicas: ReplicaWait | None,
    lane: Lane | None,
) -> tuple[list[Any], dict[str, tuple[Any, Any]]]:
    """One pipeline of `calls` (then a WAIT per primary used, when `replicas` wants one):
    (the calls' replies, primary name -> (its node, its WAIT's reply))."""
    # A lane is a standalone client's (and isinstance against RedisCluster, whose bases
    # include typing Protocols, costs some microseconds a call).
    if lane is not None or not isinstance(client, RedisCluster):
        wait = replicas is not None and await replicas.waits_on(client, "", None)
        if lane is not None:
            packed = [lane.pack(c) for c in calls]
            if wait:
                assert replicas is not None
                packed.append(hiredis.pack_command(replicas.command))
            results = await lane.exchange(b"".join(packed), len(packed))
        else:
            assert not isinstance(client, RedisCluster)
            commands = [("FCALL", c.script.function, len(c.keys), *c.keys, *c.args) for c in calls]
            if wait:
                assert replicas is not None
                commands.append(replicas.command)
            results = await _send_packed(client, commands)
        acks = {"": (None, results[len(calls)])} if wait else {}
        return results[: len(calls)], acks
    pipe = client.pipeline(transaction=False)
    for c in calls:
        pipe.execute_command("FCALL", c.script.function, len(c.keys), *c.keys, *c.args)
    waits: list[tuple[str, Any]] = []
    planned: list[str] = []
    if replicas is not None:
        # Per node, the cluster pipeline sends that node's commands in order on one
        # connection: a WAIT routed there follows its writes.
        nodes = {}
        for call in calls:
            node = client.get_node_from_key(call.keys[0])
            if node is None:
                raise RedisUnavailable(f"no node serves {call.keys[0]!r}")
            nodes[node.name] = node
            planned.append(node.name)
        for name, node in nodes.items():
            if await replicas.waits_on(client, name, node):
                pipe.execute_command(*replicas.command, target_nodes=node)
                waits.append((name, node))
    slots = client.nodes_manager.slots_cache
    results = await pipe.execute(raise_on_error=False)
    replies = results[len(calls) :]
    if waits and _rerouted(client, calls, planned, slots):
        rerouted = RedisUnavailable("the cluster's topology changed while the writes were sent")
        replies = [rerouted] * len(waits)
    acks = {name: (node, ack) for (name, node), ack in zip(waits, replies, strict=True)}
    return results[: len(calls)], acks


def _rerouted(
    client: RedisCluster, calls: list[ScriptCall], planned: list[str], slots: Any
) -> bool:
    """Whether redis-py sent some of a pipeline's calls elsewhere than planned, so a WAIT
    may not have followed its writes: it re-read the topology and sent the pipeline again
    (a WAIT sent again loses its target node, and goes to any node), or it followed a
    MOVED and sent a call alone on another connection. Either way the WAITs' answers
    prove nothing about those writes."""
    if client.nodes_manager.slots_cache is not slots:
        return True
    for call, name in zip(calls, planned, strict=True):
        node = client.get_node_from_key(call.keys[0])
        if node is None or node.name != name:
            return True
    return False


async def _send_packed(client: aioredis.Redis, commands: list[tuple[Any, ...]]) -> list[Any]:
    """Pipeline on one standalone connection, packed by hiredis.

    redis-py packs each command in Python (about 50 us for a create's 19 arguments
    here, more than Redis spends running it); hiredis packs the same bytes in C.
    Replies come back in order; error replies are returned, not raised.
    """
    assert not isinstance(client, RedisCluster)
    pool = client.connection_pool
    conn = await pool.get_connection()  # type: ignore[no-untyped-call]
    try:
        await conn.send_packed_command(
            b"".join(hiredis.pack_command(c) for c in commands), check_health=False
        )
        results: list[Any] = []
        # One deadline for the whole batch: redis-py's per-reply timeout context costs
        # about 20 us a reply, more than reading the reply.
        async with asyncio.timeout(SOCKET_TIMEOUT_S):
            for _ in commands:
                try:
                    results.append(await conn.read_response(timeout=math.inf))
                except ResponseError as exc:
                    results.append(exc)
        return results
    except BaseException:
        await conn.disconnect()  # replies may be left unread: never reuse it
        raise
    finally:
        await pool.release(conn)
