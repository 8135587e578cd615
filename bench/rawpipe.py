"""A plain pipelined Redis connection with hiredis parsing, for loading benchmarks fast.

Python only formats protocol bytes; while Redis works through one batch, the next one
is being built. Benchmarks only: the engine's own pipelines live in timewheel/store/pipeline.py.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import urlparse

import hiredis
from redis.crc import key_slot

from timewheel.engine import Engine
from timewheel.tasks.model import NewTask


def resp(args: Sequence[str | bytes | int]) -> bytes:
    """One command in the Redis protocol."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        raw = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(out)


class RawPipe:
    """Pipelined commands on one plain connection, replies parsed by hiredis."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.parser = hiredis.Reader()

    @classmethod
    async def open(cls, url: str) -> RawPipe:
        parsed = urlparse(url)
        reader, writer = await asyncio.open_connection(
            parsed.hostname or "127.0.0.1", parsed.port or 6379, limit=1 << 20
        )
        return cls(reader, writer)

    async def replies(self, count: int) -> list[Any]:
        """Read `count` replies; raise on the first error reply."""
        out: list[Any] = []
        while len(out) < count:
            reply = self.parser.gets()
            if reply is False:
                data = await self.reader.read(1 << 20)
                if not data:
                    raise ConnectionError("Redis closed the connection")
                self.parser.feed(data)
                continue
            if isinstance(reply, hiredis.ReplyError):
                raise RuntimeError(f"Redis replied with an error: {reply}")
            out.append(reply)
        return out

    async def call(self, commands: list[bytes]) -> list[Any]:
        self.writer.write(b"".join(commands))
        await self.writer.drain()
        return await self.replies(len(commands))

    async def run(self, command_batches: Iterator[list[bytes]], inflight: int = 2) -> int:
        """Send every batch, keeping up to `inflight` batches unanswered; returns commands."""
        pending: deque[int] = deque()
        total = 0
        for commands in command_batches:
            self.writer.write(b"".join(commands))
            await self.writer.drain()
            pending.append(len(commands))
            total += len(commands)
            while len(pending) >= inflight:
                await self.replies(pending.popleft())
        while pending:
            await self.replies(pending.popleft())
        return total

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


class ClusterPipes:
    """One RawPipe per primary of a Redis Cluster; each command goes to the primary that
    serves the slot of its first key (no redirects are followed: the topology is fixed
    for the length of a bench)."""

    def __init__(self, starts: list[int], owners: list[str], pipes: dict[str, RawPipe]) -> None:
        self.starts = starts  # first slot of each range, sorted
        self.owners = owners  # "host:port" serving the range that starts there
        self.pipes = pipes

    @classmethod
    async def open(cls, url: str) -> ClusterPipes:
        first = await RawPipe.open(url)
        try:
            [slots] = await first.call([resp(("CLUSTER", "SLOTS"))])
        finally:
            await first.close()
        ranges = sorted((int(r[0]), f"{r[2][0].decode()}:{int(r[2][1])}") for r in slots)
        pipes: dict[str, RawPipe] = {}
        for _, address in ranges:
            if address not in pipes:
                pipes[address] = await RawPipe.open("redis://" + address)
        return cls([r[0] for r in ranges], [r[1] for r in ranges], pipes)

    def node_of(self, key: str) -> str:
        """The "host:port" of the primary serving `key`."""
        return self.owners[bisect.bisect_right(self.starts, key_slot(key.encode())) - 1]

    async def call(self, keyed: Sequence[tuple[str, bytes]]) -> int:
        """Send every (first key, command) to its primary, all primaries at once; wait for
        every reply. Returns the commands sent."""
        by_node: dict[str, list[bytes]] = {}
        for key, command in keyed:
            by_node.setdefault(self.node_of(key), []).append(command)
        await asyncio.gather(*(self.pipes[n].call(cmds) for n, cmds in by_node.items()))
        return len(keyed)

    async def run(self, batches: Iterator[Sequence[tuple[str, bytes]]], inflight: int = 2) -> int:
        """Send every batch, each command to its primary, keeping up to `inflight` batches
        unanswered per primary; returns the commands sent."""
        pending: dict[str, deque[int]] = {n: deque() for n in self.pipes}
        total = 0
        for keyed in batches:
            by_node: dict[str, list[bytes]] = {}
            for key, command in keyed:
                by_node.setdefault(self.node_of(key), []).append(command)
            for node, commands in by_node.items():
                pipe = self.pipes[node]
                pipe.writer.write(b"".join(commands))
                await pipe.writer.drain()
                pending[node].append(len(commands))
                total += len(commands)
                while len(pending[node]) >= inflight:
                    await pipe.replies(pending[node].popleft())
        for node, counts in pending.items():
            while counts:
                await self.pipes[node].replies(counts.popleft())
        return total

    async def close(self) -> None:
        for pipe in self.pipes.values():
            await pipe.close()


def create_commands_keyed(
    engine: Engine, batch: Sequence[NewTask]
) -> tuple[list[tuple[str, bytes]], list[str]]:
    """The FCALL calls Engine.create_many would pipeline (one per shard and chunk), each
    with its first key (which routes it on a Cluster), and the task ids."""
    prepared = [engine.tasks.prepare(new) for new in batch]
    calls = engine.tasks.create_calls(prepared)
    commands = [
        (c.keys[0], resp(("FCALL", c.script.function, len(c.keys), *c.keys, *c.args)))
        for c in calls
    ]
    return commands, [p.task_id for p in prepared]


def create_commands(engine: Engine, batch: Sequence[NewTask]) -> tuple[list[bytes], list[str]]:
    """The FCALL calls Engine.create_many would pipeline (one per shard and chunk),
    and the task ids."""
    keyed, task_ids = create_commands_keyed(engine, batch)
    return [command for _, command in keyed], task_ids
