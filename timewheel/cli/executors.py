"""`timewheel worker` and `timewheel webhook`: one consumer process, or N of them.

With `--processes N` this process only supervises: it starts N copies of the command
(without --processes), each a consumer of the same group under its own name (host-pid),
restarts one that exits (after a pause that doubles, from 1 s to 30 s, while it keeps
failing), and on SIGTERM or SIGINT stops them all with SIGTERM, waiting up to
STOP_GRACE_S for the handlers in flight before SIGKILL (a run killed in flight is
retried by the reaper). A consumer whose supervisor is gone stops by itself.

Every (tenant, queue) pair of the `--tenant`s times the `--queue`s is served by each
consumer, read round robin; a `--tenant` with `*`, `?` or `[` is a pattern over the
registered tenants, matched again while the consumers run (runs/patterns.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import itertools
import os
import signal
import sys
import time
from collections.abc import Coroutine
from typing import Any

import structlog
from prometheus_client import start_http_server

from timewheel.config import Settings
from timewheel.engine import Engine
from timewheel.errors import ConfigError
from timewheel.ids import validate_name
from timewheel.runs.metrics import WorkerMetrics
from timewheel.runs.patterns import tenant_or_pattern
from timewheel.runs.webhook import WebhookExecutor
from timewheel.runs.worker import Handler, Worker

log = structlog.get_logger("timewheel")

PARENT_ENV = "TIMEWHEEL_SUPERVISOR_PID"
"""Set in each consumer a supervisor starts: the supervisor's pid."""
STOP_GRACE_S = 30.0
"""How long a stopping supervisor waits for its consumers before SIGKILL."""
RESTART_PAUSE_S = (1.0, 30.0)
"""The pause before restarting a consumer that exited: first, and at most."""
CONFIG_ERROR = 2
"""The exit status of a command that refused its arguments: not restarted."""


def load_handler(spec: str) -> Handler:
    """The function named by 'package.module:function'."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"--app {spec!r} must look like package.module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--app {spec!r}: cannot import {module_name!r}: {exc}") from exc
    handler = getattr(module, attr, None)
    if not callable(handler):
        raise ConfigError(f"--app {spec!r}: {attr!r} is not a function of {module_name}")
    return handler  # type: ignore[no-any-return]


def pairs_of(args: argparse.Namespace) -> list[tuple[str, str]]:
    """Every (tenant, queue) of the --tenant and --queue options, in their order (a
    tenant may be a pattern: runs/patterns.py)."""
    tenants = [tenant_or_pattern(t) for t in args.tenant]
    queues = [validate_name(q, "queue") for q in (args.queue or ["default"])]
    return list(dict.fromkeys(itertools.product(tenants, queues)))


def _check(args: argparse.Namespace) -> None:
    if args.processes < 1:
        raise ConfigError("--processes must be at least 1")
    if args.concurrency < 1:
        raise ConfigError("--concurrency must be at least 1")
    if args.prefetch is not None and args.prefetch < 0:
        raise ConfigError("--prefetch must be 0 or more")
    pairs_of(args)


def run_executor(args: argparse.Namespace, run: Any) -> int:
    """Run `timewheel worker` or `timewheel webhook`; `run` runs a coroutine (on uvloop).
    Returns the exit status."""
    _check(args)
    if args.command == "worker":
        sys.path.insert(0, os.getcwd())  # --app modules are found from where you are
        load_handler(args.app)  # a bad --app fails here, once, not in every process
    if args.processes > 1:
        return int(run(supervise(args)))
    run(consume(args))
    return 0


# -- one consumer -----------------------------------------------------------------------


async def consume(args: argparse.Namespace) -> None:
    """One consumer process: a Worker (or the webhook executor) until SIGINT/SIGTERM."""
    engine = await Engine.connect(Settings.from_env(None, redis_url=args.redis_url))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    watcher = _watch_supervisor(stop)
    metrics = WorkerMetrics()
    if args.metrics_port is not None:
        start_http_server(args.metrics_port, addr=args.host, registry=metrics.registry)
        log.info("metrics_listening", url=f"http://{args.host}:{args.metrics_port}/metrics")
    options: dict[str, Any] = {
        "pairs": pairs_of(args),
        "group": args.group,
        "concurrency": args.concurrency,
        "prefetch": args.prefetch,
        "metrics": metrics,
    }
    try:
        if args.command == "worker":
            worker = Worker(engine.store, **options)
            await worker.run(load_handler(args.app), stop)
        else:
            hook = WebhookExecutor(
                engine.store,
                url=args.url,
                allow_hosts=args.allow_host,
                timeout_s=args.timeout_s,
                **options,
            )
            try:
                await hook.worker.run(hook.deliver, stop)
            finally:
                await hook.aclose()
    finally:
        if watcher is not None:
            watcher.cancel()
        await engine.close()


def _watch_supervisor(stop: asyncio.Event) -> asyncio.Task[None] | None:
    """In a consumer a supervisor started: stop once the supervisor is gone."""
    parent = os.environ.get(PARENT_ENV)
    if not parent or not parent.isdigit():
        return None

    async def watch() -> None:
        while os.getppid() == int(parent):
            await asyncio.sleep(0.5)
        log.warning("supervisor_gone", supervisor=int(parent))
        stop.set()

    return asyncio.create_task(watch())


# -- the supervisor ---------------------------------------------------------------------


def child_argv(args: argparse.Namespace, index: int) -> list[str]:
    """The command line of consumer `index`: this one's, without --processes, and with
    its own metrics port."""
    argv = [args.command]
    if args.command == "worker":
        argv += ["--app", args.app]
    else:
        argv += [] if args.url is None else ["--url", args.url]
        argv += [x for host in args.allow_host for x in ("--allow-host", host)]
        argv += ["--timeout-s", repr(args.timeout_s)]
    argv += [x for t in args.tenant for x in ("--tenant", t)]
    argv += [x for q in args.queue or () for x in ("--queue", q)]
    argv += ["--group", args.group, "--concurrency", str(args.concurrency)]
    if args.prefetch is not None:
        argv += ["--prefetch", str(args.prefetch)]
    if args.metrics_port is not None:
        argv += ["--metrics-port", str(args.metrics_port + index), "--host", args.host]
    if args.redis_url:
        argv += ["--redis-url", args.redis_url]
    argv += ["--log-level", args.log_level]
    if args.log_json:
        argv.append("--log-json")
    return argv


async def supervise(args: argparse.Namespace) -> int:
    """Run `args.processes` consumers until SIGINT/SIGTERM; the exit status."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    failed: list[int] = []
    log.info("supervisor_started", command=args.command, processes=args.processes)
    await asyncio.gather(*(_keep_running(args, i, stop, failed) for i in range(args.processes)))
    log.info("supervisor_stopped", processes=args.processes)
    return CONFIG_ERROR if failed else 0


async def _keep_running(
    args: argparse.Namespace, index: int, stop: asyncio.Event, failed: list[int]
) -> None:
    """Consumer `index`: started, restarted when it exits, stopped with the supervisor."""
    pause = RESTART_PAUSE_S[0]
    env = {**os.environ, PARENT_ENV: str(os.getpid())}
    while not stop.is_set():
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "timewheel.cli", *child_argv(args, index), env=env
        )
        log.info("consumer_started", index=index, pid=proc.pid)
        exited = asyncio.create_task(proc.wait())
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({exited, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not exited.done():
            await _stop(proc, exited, index)
            return
        code = exited.result()
        if code == CONFIG_ERROR:  # it refused its arguments: so would every restart
            log.error("consumer_refused_to_start", index=index, pid=proc.pid, code=code)
            failed.append(index)
            stop.set()
            return
        if time.monotonic() - started > RESTART_PAUSE_S[1]:
            pause = RESTART_PAUSE_S[0]  # it ran for a while: a fresh failure
        log.warning("consumer_exited", index=index, pid=proc.pid, code=code, restart_in_s=pause)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), pause)
        pause = min(pause * 2, RESTART_PAUSE_S[1])


async def _stop(proc: asyncio.subprocess.Process, exited: asyncio.Task[int], index: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(asyncio.shield(exited), STOP_GRACE_S)
    except TimeoutError:
        log.warning("consumer_killed", index=index, pid=proc.pid, grace_s=STOP_GRACE_S)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await exited
    log.info("consumer_stopped", index=index, pid=proc.pid, code=proc.returncode)


def run_fast(main: Coroutine[Any, Any, Any]) -> Any:
    """Run on uvloop when it is installed (uvicorn[standard] brings it): a worker spends
    less per run on its event loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvicorn[standard] installs it
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)
