"""The HTTP protocol of timewheel/api/protocol.py, served in process to a toy app: a client
that stops taking its answer does not hold the connection, nor the task writing it."""

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


@contextlib.asynccontextmanager
async def _serve(app: BigAnswer) -> AsyncIterator[Served]:
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
