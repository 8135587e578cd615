"""The HTTP/1.1 protocol the API is served with: uvicorn's httptools protocol, plus the
limits uvicorn does not have, so that no client can hold the server.

- **Slow heads.** A request head (request line and headers) must be complete within
  `http_header_timeout_s` of the connection's opening, or, on a kept-alive connection,
  of the next request's first byte. Past it the connection is closed, without an answer.
- **Large heads.** A head over `http_max_header_bytes` is answered 431
  `headers_too_large`. Bytes are counted as they arrive and the parser is never fed
  more than one byte past the limit, so an endless header costs the limit, not memory.
- **Connections.** A request that arrives while the process has more than
  `http_max_connections` connections open is answered 503 `unavailable` (Retry-After: 1)
  and its connection closed.
- **Stalled bodies.** A request body of which no part arrives for `http_body_timeout_s`
  is answered 408 `request_timeout` (the endpoint waiting for it sees the client gone).
  The timer runs only while a body is incomplete and the server is reading: a body that
  arrives with its head, the usual case, costs nothing.
- **Stalled answers.** A client that takes no part of a large answer for
  `http_body_timeout_s` (uvicorn waits for the socket to drain) is dropped; a kept-alive
  connection that has not taken its last answer when `http_keepalive_s` ends is too.
- **Closing while the client sends.** An answer that ends a connection before the
  request was read to its end (a 431, a 413, a 503, a 401 to an unread body ...) does
  not close at once, which would let the kernel reset the connection and discard the
  answer before the client reads it: the server half-closes, drops what still arrives,
  and closes once the client does, or after `LINGER_S`.

The body size limit (`http_max_body_bytes`) is enforced in the app, by
timewheel/api/bodies.py. Malformed input (a bad request line, a Content-Length that is
not a number) is uvicorn's: a plain-text 400, then the connection is closed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, cast

from uvicorn.config import Config
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from timewheel.api.errors import error_response
from timewheel.config import Settings

LINGER_S = 2.0
"""How long a connection closed by an early answer keeps dropping what the client sends."""

HEAD_OVERHEAD = 4
"""Bytes a head line takes besides its name and value (': ' and CRLF)."""

Asgi = Callable[[Any, Any, Any], Awaitable[None]]


def refusal(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Asgi:
    """An ASGI app answering every request with the error and closing the connection."""
    response = error_response(
        status, code, message, headers={**(headers or {}), "connection": "close"}
    )
    return cast(Asgi, response)


class _Flow(FlowControl):
    """uvicorn's flow control, whose wait for a full socket buffer to drain is bounded."""

    def __init__(
        self, transport: asyncio.Transport, timeout_s: float, on_stall: Callable[[], None]
    ):
        super().__init__(transport)
        self._timeout_s = timeout_s
        self._on_stall = on_stall

    async def drain(self) -> None:
        try:
            async with asyncio.timeout(self._timeout_s):
                await super().drain()
        except TimeoutError:
            self._on_stall()


CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class _AnswerTransport(asyncio.Transport):
    """What one request's answer is written to: the connection, whose `close` lingers if
    the client may still be sending (see LimitedHttpProtocol.close_answered).

    An answer's head (status line and headers) is held until its body's first part, and
    both go out in one write: uvicorn writes them separately, two socket sends (and, on
    loopback, two wake-ups of the client) for a small JSON answer. An answer that ends
    without a body write (HEAD, or a close) sends its head when it ends. Answers of a
    connection are written one after the other, so the first write after an answer
    ended (a `100 Continue` aside) is the next answer's head."""

    def __init__(self, protocol: LimitedHttpProtocol):
        super().__init__()
        self._protocol = protocol
        self._head: bytes | bytearray | memoryview | None = None
        self._awaiting_head = True

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._protocol.lingering:
            return
        if self._head is not None:
            data, self._head = b"".join((self._head, data)), None
        elif self._awaiting_head and data != CONTINUE:
            self._awaiting_head = False
            self._head = data
            return
        self._protocol.transport.write(data)

    def answer_ended(self) -> None:
        """The answer is complete: send a head still held, and wait for the next one."""
        self._awaiting_head = True
        if self._head is not None:
            head, self._head = self._head, None
            if not self._protocol.lingering:
                self._protocol.transport.write(head)

    def is_closing(self) -> bool:
        return self._protocol.lingering or self._protocol.transport.is_closing()

    def close(self) -> None:
        self.answer_ended()
        self._protocol.close_answered()


class LimitedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits of the module docstring; a subclass
    made by `protocol_class` holds the settings they come from."""

    settings: ClassVar[Settings] = Settings()

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.max_head = self.settings.http_max_header_bytes
        self.head_timer: asyncio.TimerHandle | None = None
        self.body_timer: asyncio.TimerHandle | None = None
        self.body_seen = 0.0
        """Loop time of the current request's last body bytes (or of its head's end)."""
        self.linger_timer: asyncio.TimerHandle | None = None
        self.in_head = True
        """No request head is complete since the last request ended (or the opening)."""
        self.head_bytes = 0
        """Bytes received of the current head (a read that also ended a request is not
        counted: its split is not known; the head's parsed size is checked at its end)."""
        self.message_ended = False
        self.lingering = False
        self.answer_transport = _AnswerTransport(self)

    # -- the connection ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.flow = _Flow(transport, self.settings.http_body_timeout_s, self.drop_stalled)
        self.arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self.head_timer, self.body_timer, self.linger_timer):
            if timer is not None:
                timer.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.lingering:
            return  # the answer is out; what the client still sends is dropped
        self.receive(data)
        if not self.in_head and self.body_timer is None and not self.lingering:
            self.arm_body_timer()  # a head came, its body is not all here

    def receive(self, data: bytes) -> None:
        while data:
            if not self.in_head:
                self.feed(data)
                return
            if self.head_timer is None:
                self.arm_head_timer()
            room = self.max_head - self.head_bytes
            part = data if len(data) <= room else data[: room + 1]  # one byte past, at most
            self.feed(part)
            if self.lingering or self.transport.is_closing():
                return
            if self.in_head and not self.message_ended:
                self.head_bytes += len(part)
                if self.head_bytes > self.max_head:
                    self.refuse_head()
                    return
            data = data[len(part) :]

    def feed(self, data: bytes) -> None:
        self.message_ended = False
        super().data_received(data)

    def eof_received(self) -> None:
        pass  # the transport closes; a lingering connection is done

    # -- parser callbacks --------------------------------------------------------------

    def on_headers_complete(self) -> None:
        self.in_head = False
        self.body_seen = self.loop.time()
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None
        size = len(self.url) + sum(len(n) + len(v) + HEAD_OVERHEAD for n, v in self.headers)
        if size > self.max_head:
            refused: Asgi | None = refusal(
                431, "headers_too_large", f"request head over {self.max_head} bytes"
            )
        elif len(self.connections) > self.settings.http_max_connections:
            refused = refusal(
                503,
                "unavailable",
                "the api process is at its connection limit; retry",
                {"retry-after": "1"},
            )
        else:
            refused = None
        if refused is None:
            super().on_headers_complete()
        else:
            app, self.app = self.app, refused
            try:
                super().on_headers_complete()
            finally:
                self.app = app
        if self.cycle is not None:
            self.cycle.transport = self.answer_transport

    def on_body(self, body: bytes) -> None:
        self.body_seen = self.loop.time()
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self.body_timer is not None:
            self.body_timer.cancel()
            self.body_timer = None
        self.in_head = True
        self.head_bytes = 0
        self.message_ended = True
        super().on_message_complete()

    def on_response_complete(self) -> None:
        self.answer_transport.answer_ended()
        if self.lingering:
            self.server_state.total_requests += 1
            return  # no keep-alive, no pipelined request: the connection is ending
        super().on_response_complete()

    # -- timeouts ----------------------------------------------------------------------

    def arm_head_timer(self) -> None:
        self.head_timer = self.loop.call_later(
            self.settings.http_header_timeout_s, self.head_timed_out
        )

    def head_timed_out(self) -> None:
        self.head_timer = None
        if not self.in_head or self.lingering or self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self.arm_head_timer()  # a pipelined head waits on our answer, not the client
            return
        self.end()

    def arm_body_timer(self, delay: float | None = None) -> None:
        timeout = self.settings.http_body_timeout_s
        self.body_timer = self.loop.call_later(
            timeout if delay is None else delay, self.body_timed_out
        )

    def body_timed_out(self) -> None:
        self.body_timer = None
        if self.in_head or self.lingering or self.transport.is_closing():
            return
        idle = self.loop.time() - self.body_seen
        timeout = self.settings.http_body_timeout_s
        if self.flow.read_paused or idle < timeout:
            # the server is not reading (the endpoint is busy), or bytes came since
            self.arm_body_timer(timeout if self.flow.read_paused else timeout - idle)
            return
        if self.cycle is None or self.cycle.response_started:
            self.linger()
            return
        self.write_error(
            408, "request_timeout", f"no part of the request body came within {timeout} s"
        )

    def timeout_keep_alive_handler(self) -> None:
        if not self.transport.is_closing():
            self.end()

    def drop_stalled(self) -> None:
        """The client took no part of the answer for http_body_timeout_s."""
        if self.cycle is not None:
            self.cycle.disconnected = True
        self.transport.abort()

    def end(self) -> None:
        """Close; drop what the client has not taken instead of waiting for it."""
        if self.transport.get_write_buffer_size():
            self.transport.abort()
        else:
            self.transport.close()

    # -- closing after an answer -------------------------------------------------------

    def close_answered(self) -> None:
        """Close after an answer: at once if the request was read to its end, else by
        lingering (module docstring)."""
        if self.in_head:
            self.transport.close()
        else:
            self.linger()

    def linger(self) -> None:
        transport = self.transport
        if self.lingering or transport.is_closing():
            return
        if not transport.can_write_eof():
            transport.close()
            return
        self.lingering = True
        self.pipeline.clear()
        self.flow.resume_reading()
        transport.write_eof()  # FIN once the answer is out; reading goes on
        self.linger_timer = self.loop.call_later(LINGER_S, transport.abort)

    def write_answer(self, status: int, content_type: bytes, body: bytes) -> None:
        """Write a whole answer outside any request cycle, then linger. A request still
        being answered is cut off: its endpoint sees the client gone, and what it
        answers goes nowhere."""
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()
        content = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            content.extend([name, b": ", value, b"\r\n"])
        content.extend(
            [
                b"content-type: " + content_type + b"\r\n",
                b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
                b"connection: close\r\n\r\n",
                body,
            ]
        )
        self.transport.write(b"".join(content))
        self.linger()

    def write_error(self, status: int, code: str, message: str) -> None:
        """write_answer of an error in the API's JSON form."""
        error = {"code": code, "message": message, "field": None}
        body = json.dumps({"error": error}, separators=(",", ":")).encode()
        self.write_answer(status, b"application/json", body)

    def refuse_head(self) -> None:
        """A head still incomplete past the limit."""
        self.write_error(431, "headers_too_large", f"request head over {self.max_head} bytes")

    def _unsupported_upgrade_warning(self) -> None:
        """Nothing to warn about: no endpoint speaks WebSocket (uvicorn runs with ws="none"),
        so an upgrade request is answered as an ordinary one."""

    def send_400_response(self, msg: str) -> None:
        """uvicorn's plain-text 400 for input it cannot parse, closed by lingering."""
        self.write_answer(400, b"text/plain; charset=utf-8", msg.encode("ascii"))


def protocol_class(settings: Settings) -> type[LimitedHttpProtocol]:
    """The protocol to give uvicorn (`uvicorn.Config(http=...)`), with these settings."""
    return type("HttpProtocol", (LimitedHttpProtocol,), {"settings": settings})
