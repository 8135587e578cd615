"""The HTTP server's own limits, against a real `timewheel api` process spoken to over raw
sockets: slow and half-open heads, oversized heads, bodies over the limit (declared or
chunked), a body that stops coming, idle kept-alive connections, the connection bound,
and malformed protocol input (docs/operations/deployment.md, "What the HTTP server
answers itself")."""

from __future__ import annotations

import json
import secrets
import selectors
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from timewheel.sdk.client import Client
from timewheel.store.server import RedisServer
from timewheel.testing.apiserver import ApiServer, start_api

HEADER_TIMEOUT_S = 3
KEEPALIVE_S = 2
BODY_TIMEOUT_S = 2
MAX_CONNECTIONS = 250
MAX_BODY_BYTES = 1 << 20
MAX_HEADER_BYTES = 16_384
SINGLE_CREATE_LIMIT = 2 * 65_536 + 65_536
"""The single create's own body limit: twice the default max_payload_bytes plus 64 KiB."""
MARGIN_S = 15
"""Slack on top of a server timeout before a test gives up waiting for its effect."""


@pytest.fixture(scope="module")
def api_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("api-limits") / "api.log"


@pytest.fixture(scope="module")
def api(redis_standalone: RedisServer, api_log: Path) -> Iterator[ApiServer]:
    """A `timewheel api` process with short timeouts and small bounds."""
    log = api_log
    proc, server = start_api(
        redis_standalone.url,
        log,
        env={
            "TIMEWHEEL_HTTP_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
            "TIMEWHEEL_HTTP_KEEPALIVE_S": str(KEEPALIVE_S),
            "TIMEWHEEL_HTTP_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
            "TIMEWHEEL_HTTP_MAX_CONNECTIONS": str(MAX_CONNECTIONS),
            "TIMEWHEEL_HTTP_MAX_BODY_BYTES": str(MAX_BODY_BYTES),
        },
    )
    assert server.settings.http_max_header_bytes == MAX_HEADER_BYTES
    try:
        yield server
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert "Traceback" not in log.read_text(), log.read_text()


@pytest.fixture(scope="module")
def tenant_key(api: ApiServer) -> str:
    tenant = "limits-" + secrets.token_hex(3)
    with Client(api.url, api.admin_key) as admin:
        admin.create_tenant(tenant)
        return admin.create_key(tenant)["key"]


def _connect(api: ApiServer) -> socket.socket:
    host, port = api.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=MARGIN_S)


def _head(method: str, path: str, *headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *headers, "", ""]
    return "\r\n".join(lines).encode()


def _answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """The next answer on `sock`: status, headers (lower-case names), body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65_536)
        assert chunk, f"connection closed before a whole answer: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65_536)
        assert chunk, "connection closed in the middle of an answer"
        body += chunk
    return int(status_line.split()[1]), headers, body


def _error(body: bytes) -> dict[str, str | None]:
    error: dict[str, str | None] = json.loads(body)["error"]
    return error


def _assert_closed(sock: socket.socket) -> None:
    """The server ends the connection (FIN or reset) with nothing more to say."""
    try:
        rest = sock.recv(65_536)
    except ConnectionResetError:
        rest = b""
    assert rest == b"", f"more after the answer: {rest[:200]!r}"


def _send_chunked(sock: socket.socket, total: int, chunk: int = 16_384) -> None:
    """Send a chunked body of `total` bytes; a server that has answered may stop reading."""
    sent = 0
    try:
        while sent < total:
            sock.sendall(b"%x\r\n%s\r\n" % (chunk, b"x" * chunk))
            sent += chunk
    except OSError:
        pass


def test_half_open_connections_neither_hold_the_server_nor_stay_open(
    api: ApiServer, tenant_key: str
) -> None:
    partial = _head("POST", "/v1/tasks", "Content-Type: application/json")[:-4]
    held: list[socket.socket] = []
    try:
        for _ in range(200):
            sock = _connect(api)
            sock.sendall(partial[: len(partial) // 2])
            held.append(sock)
        # Well-behaved clients are answered meanwhile ...
        assert httpx.get(f"{api.url}/healthz", timeout=MARGIN_S).status_code == 200
        created = httpx.post(
            f"{api.url}/v1/tasks",
            json={"delay": 3600},
            headers={"Authorization": f"Bearer {tenant_key}"},
            timeout=MARGIN_S,
        )
        assert created.status_code == 201, created.text
        # ... and each half-open connection is closed, without an answer, once its
        # header timeout has passed.
        selector = selectors.DefaultSelector()
        for sock in held:
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ)
        still_open = set(held)
        deadline = time.monotonic() + HEADER_TIMEOUT_S + MARGIN_S
        while still_open and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=0.5):
                sock = key.fileobj  # type: ignore[assignment]
                _assert_closed(sock)
                selector.unregister(sock)
                still_open.discard(sock)
        selector.close()
        assert not still_open, f"{len(still_open)} of 200 half-open connections still open"
    finally:
        for sock in held:
            sock.close()
    assert httpx.get(f"{api.url}/healthz", timeout=MARGIN_S).status_code == 200


def test_a_head_over_the_limit_is_answered_431_and_the_server_stays_healthy(
    api: ApiServer,
) -> None:
    with _connect(api) as sock:
        sock.sendall(_head("GET", "/healthz", "X-Big: " + "a" * (1 << 20)))
        status, headers, body = _answer(sock)
        assert status == 431
        assert headers["connection"] == "close"
        assert _error(body)["code"] == "headers_too_large"
        _assert_closed(sock)
    with _connect(api) as sock:  # a large head within the limit is a request like any
        sock.sendall(_head("GET", "/healthz", "X-Big: " + "a" * (MAX_HEADER_BYTES // 2)))
        assert _answer(sock)[0] == 200
    assert httpx.get(f"{api.url}/healthz", timeout=MARGIN_S).status_code == 200


def test_malformed_protocol_input_is_answered_400_and_the_connection_closed(
    api: ApiServer,
) -> None:
    for request in (
        b"NOT A REQUEST LINE\r\n\r\n",
        _head("POST", "/v1/tasks", "Content-Length: twelve"),
    ):
        with _connect(api) as sock:
            sock.sendall(request)
            status, headers, body = _answer(sock)
            assert (status, headers["connection"]) == (400, "close"), body
            assert headers["content-type"].startswith("text/plain")
            _assert_closed(sock)


def test_a_content_length_over_the_limit_is_answered_413_before_the_body_is_sent(
    api: ApiServer, tenant_key: str
) -> None:
    # Over the server's limit: answered before routing and authentication.
    with _connect(api) as sock:
        sock.sendall(
            _head(
                "POST",
                "/v1/tasks/batch",
                f"Content-Length: {MAX_BODY_BYTES + 1}",
                "Content-Type: application/json",
                "Expect: 100-continue",
            )
        )
        status, headers, body = _answer(sock)
        assert (status, headers["connection"]) == (413, "close")
        assert _error(body)["code"] == "payload_too_large"
        _assert_closed(sock)
    # Under it, but over a single create's own limit: answered by the endpoint, unread.
    with _connect(api) as sock:
        sock.sendall(
            _head(
                "POST",
                "/v1/tasks",
                f"Content-Length: {SINGLE_CREATE_LIMIT + 1}",
                "Content-Type: application/json",
                f"Authorization: Bearer {tenant_key}",
            )
        )
        status, headers, body = _answer(sock)
        assert (status, headers["connection"]) == (413, "close")
        assert _error(body)["code"] == "payload_too_large"
        _assert_closed(sock)


@pytest.mark.parametrize(
    ("path", "limit"),
    [("/v1/tasks/batch", MAX_BODY_BYTES), ("/v1/tasks", SINGLE_CREATE_LIMIT)],
    ids=["server-limit", "endpoint-limit"],
)
def test_a_chunked_body_over_the_limit_is_cut_with_413(
    api: ApiServer, tenant_key: str, path: str, limit: int
) -> None:
    with _connect(api) as sock:
        sock.sendall(
            _head(
                "POST",
                path,
                "Transfer-Encoding: chunked",
                "Content-Type: application/json",
                f"Authorization: Bearer {tenant_key}",
            )
        )
        _send_chunked(sock, limit + 65_536)
        status, headers, body = _answer(sock)
        assert (status, headers["connection"]) == (413, "close")
        assert _error(body)["code"] == "payload_too_large"
        _assert_closed(sock)
    assert httpx.get(f"{api.url}/healthz", timeout=MARGIN_S).status_code == 200


def test_a_body_that_stops_coming_is_answered_408(api: ApiServer, tenant_key: str) -> None:
    with _connect(api) as sock:
        sock.sendall(
            _head(
                "POST",
                "/v1/tasks",
                "Content-Length: 100",
                "Content-Type: application/json",
                f"Authorization: Bearer {tenant_key}",
            )
            + b'{"delay": '
        )
        status, headers, body = _answer(sock)  # the socket's timeout bounds the wait
        assert (status, headers["connection"]) == (408, "close")
        assert _error(body)["code"] == "request_timeout"
        _assert_closed(sock)


def test_a_client_that_hangs_up_in_the_middle_of_its_body_leaves_no_error(
    api: ApiServer, api_log: Path, tenant_key: str
) -> None:
    with _connect(api) as sock:
        sock.sendall(
            _head(
                "POST",
                "/v1/tasks",
                "Content-Length: 100",
                "Content-Type: application/json",
                f"Authorization: Bearer {tenant_key}",
            )
            + b'{"delay": '
        )
        time.sleep(0.5)  # the endpoint is reading the body
    assert httpx.get(f"{api.url}/healthz", timeout=MARGIN_S).status_code == 200
    assert "Traceback" not in api_log.read_text()


def test_an_idle_kept_alive_connection_is_closed_after_the_keepalive_timeout(
    api: ApiServer,
) -> None:
    with _connect(api) as sock:
        sock.sendall(_head("GET", "/healthz"))
        status, headers, _ = _answer(sock)
        assert status == 200 and "connection" not in headers  # kept alive ...
        sock.sendall(_head("GET", "/healthz"))
        assert _answer(sock)[0] == 200  # ... and used again
        sock.settimeout(KEEPALIVE_S + MARGIN_S)
        _assert_closed(sock)  # ... and closed once idle for http_keepalive_s


def test_requests_past_the_connection_bound_are_answered_503(api: ApiServer) -> None:
    held = [_connect(api) for _ in range(MAX_CONNECTIONS)]
    try:
        with _connect(api) as sock:
            sock.sendall(_head("GET", "/healthz"))
            status, headers, body = _answer(sock)
            assert (status, headers["connection"], headers["retry-after"]) == (503, "close", "1")
            assert _error(body)["code"] == "unavailable"
            _assert_closed(sock)
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + MARGIN_S
    while True:  # the server sees the held connections close
        status = httpx.get(f"{api.url}/healthz", timeout=MARGIN_S).status_code
        if status == 200:
            break
        assert status == 503 and time.monotonic() < deadline, status
        time.sleep(0.1)
