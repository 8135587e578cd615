"""Request bodies: the size limit every route has, before any endpoint reads a byte.

`BodyLimits` is the ASGI middleware of the app (timewheel/api/app.py):

- a Content-Length over `http_max_body_bytes` is answered 413 `payload_too_large` at
  once, before routing and authentication, without reading the body (nor sending a
  `100 Continue`);
- a chunked body is counted as the endpoint reads it and cut there, with the same 413;
- a client that hangs up in the middle of its body ends the request as a 400 (which
  nobody reads), not as an error of the endpoint;
- an answer that leaves a request body unread (one of the above, or a 401 to a body that
  was never read) closes the connection (`Connection: close`): the rest of the body is
  not read to find where the next request begins.

An endpoint may take less than `http_max_body_bytes`: its own limit is checked when it
reads the body (`max_body_bytes` in timewheel/api/endpoints.py). A body that stops
coming is the HTTP protocol's to time out (timewheel/api/protocol.py). Requests without
Content-Length or Transfer-Encoding have no body (HTTP/1.1) and pass untouched.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from timewheel.api.errors import error_response


class BodyLimits:
    """The middleware; `max_bytes` is the http_max_body_bytes setting."""

    def __init__(self, app: ASGIApp, *, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length: bytes | None = None
        chunked = False
        for name, value in scope["headers"]:
            if name == b"content-length":
                length = value
            elif name == b"transfer-encoding":
                chunked = True
        if not chunked and (length is None or length == b"0"):
            await self.app(scope, receive, send)
            return
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            response = error_response(
                413,
                "payload_too_large",
                f"request body over {self.max_bytes} bytes",
                headers={"connection": "close"},
            )
            await response(scope, receive, send)
            return
        body = _Body(receive, send, self.max_bytes)
        await self.app(scope, body.receive, body.send)


class _Body:
    """One request's body as the app reads it, and its answer."""

    def __init__(self, receive: Receive, send: Send, max_bytes: int):
        self._receive = receive
        self._send = send
        self._max_bytes = max_bytes
        self._size = 0
        self._complete = False

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.request":
            self._size += len(message.get("body", b""))
            if self._size > self._max_bytes:
                raise HTTPException(413, f"request body over {self._max_bytes} bytes")
            if not message.get("more_body", False):
                self._complete = True
        elif not self._complete:  # http.disconnect: nobody is left to answer
            self._complete = True
            raise HTTPException(400, "the connection closed before the end of the body")
        return message

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start" and not self._complete:
            headers = [*message.get("headers", []), (b"connection", b"close")]
            message = {**message, "headers": headers}
        await self._send(message)
