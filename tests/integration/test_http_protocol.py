"""The HTTP protocol of timewheel/api/protocol.py, served in process to a toy app: a client
that stops taking its answer does not hold the connection, nor the task writing it; an
answer's head goes out with its body, in one write."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from timewheel.api.protocol import protocol_class
from timewheel.config import Settings

MIB = 1 << 20
MARGIN_S = 15.0


@dataclass
class BigAnswer:
    """An ASGI app answering 32 MiB, in 1 MiB parts or in one, and noting when it is done."""

    parts: int
    done: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        size = 32 * MIB
        headers = [(b"content-length", str(size).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for i in range(self.parts):
            body = b"x" * (size // self.parts)
            await send(
                {"type": "http.response.body", "body": body, "more_body": i < self.parts - 1}
            )
        self.done.set()


@dataclass
class Served:
    port: int
    state: ServerState


@dataclass
class SmallAnswer:
    """An ASGI app that reads the body and answers it back, in `parts` body messages."""

    parts: int = 1

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        answer = b"got:" + body
        headers = [(b"content-length", str(len(answer)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        step = -(-len(answer) // self.parts)
        for i in range(self.parts):
            part = answer[i * step : (i + 1) * step]
            more = i < self.parts - 1
            await send({"type": "http.response.body", "body": part, "more_body": more})


@contextlib.asynccontextmanager
async def _serve(app: Any) -> AsyncIterator[Served]:
    config = uvicorn.Config(app, lifespan="off", log_level="warning", timeout_keep_alive=1)
    config.load()
    settings = Settings(http_body_timeout_s=1)
    protocol = protocol_class(settings)
    state = ServerState()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: protocol(config=config, server_state=state, app_state={}), "127.0.0.1", 0
    )
    try:
        yield Served(server.sockets[0].getsockname()[1], state)
    finally:
        server.close()
        for connection in list(state.connections):
            connection.transport.abort()
        await server.wait_closed()


async def _client_that_never_reads(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", port))
    await loop.sock_sendall(sock, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    return sock


async def _until_no_connections(state: ServerState) -> None:
    async with asyncio.timeout(MARGIN_S):
        while state.connections:
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("parts", [32, 1], ids=["stalled-mid-answer", "answer-never-taken"])
async def test_a_client_that_stops_reading_is_dropped(parts: int) -> None:
    """In parts, the writer waits for the socket to drain: http_body_timeout_s ends the wait.
    In one part, the answer is written and the connection kept alive: the keep-alive
    timeout drops it with what was not taken (a plain close would wait for the client)."""
    app = BigAnswer(parts)
    async with _serve(app) as server:
        sock = await _client_that_never_reads(server.port)
        try:
            async with asyncio.timeout(MARGIN_S):
                await app.done.wait()
            await _until_no_connections(server.state)
            assert not server.state.connections
        finally:
            sock.close()


async def _exchange(port: int, data: bytes, *, answers: int, then: bytes = b"") -> bytes:
    """Send `data` (and `then`, once the server wrote something), read until `answers`
    answers are complete (each answer ends with its body 'got:...' of known length)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        received = b""
        async with asyncio.timeout(MARGIN_S):
            if then:
                received += await reader.readuntil(b"\r\n\r\n")
                writer.write(then)
            while received.count(b"HTTP/1.1 200") < answers or not received.endswith(b"!"):
                chunk = await reader.read(65536)
                assert chunk, received
                received += chunk
        return received
    finally:
        writer.close()


def _counting_writes(state: ServerState) -> list[bytes]:
    """The writes the server's (one) connection makes to its socket from now on."""
    [connection] = list(state.connections)
    transport: Any = connection.transport
    writes: list[bytes] = []
    write = transport.write

    def counted(data: bytes | bytearray | memoryview) -> None:
        writes.append(bytes(data))
        write(data)

    transport.write = counted
    return writes


async def test_an_answer_goes_out_in_one_write_with_its_head() -> None:
    """uvicorn writes an answer's head, then its body: two sends. The protocol holds the
    head for the body: one write per answer, two pipelined requests two writes."""
    async with _serve(SmallAnswer()) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            async with asyncio.timeout(MARGIN_S):
                while not server.state.connections:
                    await asyncio.sleep(0.01)
                writes = _counting_writes(server.state)
                request = b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nhi"
                writer.write(request * 2)
                received = b""
                while received.count(b"got:hi") < 2:
                    chunk = await reader.read(65536)
                    assert chunk, received
                    received += chunk
        finally:
            writer.close()
    assert len(writes) == 2
    assert all(
        w.startswith(b"HTTP/1.1 200 OK\r\n") and w.endswith(b"\r\n\r\ngot:hi") for w in writes
    )


async def test_answers_without_a_body_write_in_parts_or_after_continue_arrive_whole() -> None:
    """A HEAD answer (no body write) gets its head when it ends; a body sent in parts
    follows its head; a client expecting 100 Continue gets it before its answer."""
    async with _serve(SmallAnswer(parts=3)) as server:
        port = server.port
        parts = await _exchange(
            port, b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 7\r\n\r\nabcdef!", answers=1
        )
        assert parts.endswith(b"\r\n\r\ngot:abcdef!")
        continued = await _exchange(
            port,
            b"POST / HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 3\r\n\r\n",
            answers=1,
            then=b"ok!",
        )
        assert continued.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n")
        assert continued.endswith(b"got:ok!")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"HEAD / HTTP/1.1\r\nhost: x\r\n\r\n")
            async with asyncio.timeout(MARGIN_S):
                head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"content-length: 4" in head
        finally:
            writer.close()
