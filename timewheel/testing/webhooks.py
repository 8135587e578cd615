"""A webhook executor's target in tests: a local HTTP server that answers 200 to every
POST and notes its Idempotency-Key (the run id), so a test counts deliveries by run id."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from timewheel.store.server import find_free_port


@contextlib.contextmanager
def webhook_receiver() -> Iterator[tuple[str, list[str]]]:
    """(URL to POST to, the run ids posted so far, in order) while the block runs."""
    keys: list[str] = []
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", "0")))
            with lock:
                keys.append(self.headers.get("idempotency-key", ""))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            del format, args

    server = ThreadingHTTPServer(("127.0.0.1", find_free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook", keys
    finally:
        server.shutdown()
        server.server_close()
