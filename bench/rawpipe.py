"""A plain pipelined Redis connection with hiredis parsing, for loading benchmarks fast.

Python only formats protocol bytes; while Redis works through one batch, the next one
is being built. Benchmarks only: the engine's own pipelines live in timewheel/store/pipeline.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import urlparse

import hiredis

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


def create_commands(engine: Engine, batch: Sequence[NewTask]) -> tuple[list[bytes], list[str]]:
    """The FCALL calls Engine.create_many would pipeline (one per shard and chunk),
    and the task ids."""
    prepared = [engine.tasks.prepare(new) for new in batch]
    calls = engine.tasks.create_calls(prepared)
    commands = [resp(("FCALL", c.script.function, len(c.keys), *c.keys, *c.args)) for c in calls]
    return commands, [p.task_id for p in prepared]
