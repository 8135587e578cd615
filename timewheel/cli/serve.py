"""Running the processes: the API under uvicorn, the scheduler, or both, until a signal."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
from collections.abc import Generator

import structlog
import uvicorn
from prometheus_client import start_http_server

from timewheel.api import create_app
from timewheel.api.protocol import protocol_class
from timewheel.dispatch.metrics import SchedulerMetrics
from timewheel.dispatch.scheduler import Scheduler
from timewheel.engine import Engine

log = structlog.get_logger("timewheel")


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: we stop it together with the scheduler."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def _on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


async def serve(
    engine: Engine,
    *,
    api: bool,
    scheduler: bool,
    host: str = "127.0.0.1",
    port: int = 8080,
    node: str | None = None,
    lease_ttl_ms: int = 2000,
    metrics_port: int | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Run the API and/or the scheduler on `engine` until SIGINT/SIGTERM (or `stop`).

    The scheduler claims shards by lease as `node` (a generated id if None).
    """
    stop = stop or asyncio.Event()
    _on_signals(stop)
    tasks: list[asyncio.Task[object]] = []
    server: _Server | None = None
    if api:
        settings = engine.settings
        config = uvicorn.Config(
            create_app(settings, engine=engine),
            host=host,
            port=port,
            log_level="warning",
            access_log=False,  # one log call per request; /metrics counts requests instead
            lifespan="on",
            # httptools with the limits of timewheel/api/protocol.py: head timeout and
            # size, the connection bound, lingering closes
            http=protocol_class(settings),
            ws="none",  # no endpoint speaks WebSocket: an upgrade is an ordinary request
            timeout_keep_alive=settings.http_keepalive_s,
        )
        server = _Server(config)
        tasks.append(asyncio.create_task(server.serve()))
        log.info("api_listening", url=f"http://{host}:{port}")
    if scheduler:
        metrics = SchedulerMetrics()
        if metrics_port is not None:
            start_http_server(metrics_port, addr=host, registry=metrics.registry)
            log.info("metrics_listening", url=f"http://{host}:{metrics_port}/metrics")
        node_id = node or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"
        sched = Scheduler(engine.store, node=node_id, lease_ttl_ms=lease_ttl_ms, metrics=metrics)
        tasks.append(asyncio.create_task(sched.run(stop)))
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait({stopper, *tasks}, return_when=asyncio.FIRST_COMPLETED)
    stop.set()
    if server is not None:
        server.should_exit = True
    results = await asyncio.gather(*tasks, return_exceptions=True)
    stopper.cancel()
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
            raise result
