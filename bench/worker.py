"""Executors: `timewheel worker` processes against a `timewheel scheduler` process.

Each part runs on a fresh redis-server with AOF appendfsync always, 64 shards, ONE tenant
spread over 16 shards (a worker reads 16 streams), 100-byte payloads. The worker runs the
no-op async handler of bench/worker_app.py, which notes each run's due time and start;
the start lag is start - due_ms (the node's clock against Redis's: the same machine).
CPU is read from /proc for the worker processes and from INFO cpu for Redis.

a. herd: 100,000 runs due within one second (due = T0 + i mod 1000 ms), created into the
   wheel before T0 while the scheduler runs; one worker process (concurrency 50), then
   one with --processes 2. Figures: the last handler start after T0 (targets: at most
   4 s with one process, 3 s with two), the first, the start lag percentiles, CPU per run.
b. steady: a load generator creates 10,000 runs/s for 30 s, each due 1 s after its
   create; one worker process. Figures: start lag p50 / p99 / max (target p99 at most
   50 ms), worker CPU per run.
c. backlog: 200,000 runs dispatched before the worker starts; it drains them. Figures:
   runs/s from the first start to the last ack, worker CPU per run.
d. runners: no Redis; what running a no-op handler with bounded concurrency costs, a task
   per run against a pool of runners, asyncio.to_thread per run against handler threads.
e. pairs: one worker process serving several tenants (the same spread of 16). "many": 8
   tenants with 12,500 runs each dispatched before it starts; runs/s from the first start
   to the last ack, and worker CPU per run. "slow": one tenant's 500 runs take 1 s each
   in the handler (bench/worker_app.py slow_some), another's 20,000 none; the seconds
   until the fast tenant's runs are all acknowledged, from the worker's start.

Run:  .venv/bin/python bench/worker.py                 (every part)
      .venv/bin/python bench/worker.py --quick         (a tenth of the sizes, steady 10 s)
      .venv/bin/python bench/worker.py --parts herd --processes 1 --out /tmp/w.json
      .venv/bin/python bench/worker.py --parts herd --processes 1 --runs 5000 \
          --worker-callgrind      (the worker's instructions per run, which the host's
                                   load does not change)

With PYTHONPATH set to another checkout, the processes run that checkout's code (an A/B
comparison: give --processes 1 to a tree whose worker has no --processes).
"""

from __future__ import annotations

import argparse
import array
import asyncio
import collections
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from common import CallgrindControl, percentile, scheduler_process
from dispatch import host_gauge, payload_json, server_ms
from herd import load as load_herd
from rawpipe import RawPipe, create_commands

from timewheel.config import Settings
from timewheel.engine import Engine
from timewheel.store.server import RedisServer
from timewheel.tasks.model import NewTask

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results" / "worker.json"
SHARDS = 64
SPREAD = 16
TENANT = "bench"
CONCURRENCY = 50
HERD_TARGET_MS = {1: 4_000, 2: 3_000}
STEADY_P99_TARGET_MS = 50
NOTE_BYTES = 24
"""What bench/worker_app.py notes per run: three doubles."""
LOAD_RATE_GUESS = 12_000
"""Creates/s assumed when picking T0 of the herd."""
CLK_TCK = os.sysconf("SC_CLK_TCK")
PREFETCH: int | None = None
WORKER_CALLGRIND: Path | None = None
"""With --worker-callgrind: the herd's worker process runs under valgrind's callgrind
(dumps here), instrumented only while it drains the herd."""
"""--prefetch of the worker processes (None: the worker's default)."""


def settings_for(url: str) -> Settings:
    return Settings(redis_url=url, prefix="wb", shards=SHARDS, default_spread=SPREAD)


def process_env() -> dict[str, str]:
    return {
        **os.environ,
        "TIMEWHEEL_PREFIX": "wb",
        "TIMEWHEEL_SHARDS": str(SHARDS),
        "TIMEWHEEL_DEFAULT_SPREAD": str(SPREAD),
        "PYTHONUNBUFFERED": "1",
    }


# -- the worker processes ---------------------------------------------------------------


def process_cpu_s(pid: int) -> float:
    """utime + stime of one process, in seconds (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class WorkerProcess:
    """`timewheel worker --app worker_app:noop` (from bench/, so the module is found)."""

    def __init__(
        self,
        url: str,
        work: Path,
        processes: int,
        concurrency: int,
        *,
        tenants: tuple[str, ...] = (TENANT,),
        app: str = "worker_app:noop",
        env: dict[str, str] | None = None,
    ) -> None:
        self.notes = work / "notes"
        self.log_path = work / f"worker-{processes}.log"
        command = [sys.executable, "-m", "timewheel.cli", "worker", "--app", app]
        command += [x for tenant in tenants for x in ("--tenant", tenant)]
        command += ["--concurrency", str(concurrency), "--redis-url", url]
        command += ["--log-json"]
        if processes > 1:  # a tree without --processes runs one process only
            command += ["--processes", str(processes)]
        if PREFETCH is not None:
            command += ["--prefetch", str(PREFETCH)]
        if WORKER_CALLGRIND is not None:
            command = [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--callgrind-out-file={WORKER_CALLGRIND}/cg.%p",
                *command,
            ]
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=BENCH,
                env={**process_env(), "TW_BENCH_NOTES": str(self.notes), **(env or {})},
            )
        self.processes = processes

    def callgrind(self) -> CallgrindControl:
        """callgrind_control on the worker process (under --worker-callgrind)."""
        assert WORKER_CALLGRIND is not None
        return CallgrindControl(WORKER_CALLGRIND, self.proc.pid)

    async def wait_started(self, timeout_s: float = 30.0) -> None:
        if WORKER_CALLGRIND is not None:
            timeout_s *= 10  # valgrind starts Python some 50 times slower
        deadline = time.monotonic() + timeout_s
        while self.log_path.read_text(errors="replace").count("worker_started") < self.processes:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker did not start:\n{self.log_path.read_text()[-3000:]}")
            await asyncio.sleep(0.05)

    def pids(self) -> list[int]:
        """The process and its children (the consumers of --processes)."""
        pids = [self.proc.pid]
        with_children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        if with_children.exists():
            pids += [int(p) for p in with_children.read_text().split()]
        return pids

    def cpu_s(self) -> float:
        """utime + stime of the process and its children, in seconds."""
        return sum(process_cpu_s(pid) for pid in self.pids())

    def noted(self) -> int:
        return sum(
            p.stat().st_size // NOTE_BYTES for p in self.notes.parent.glob(self.notes.name + ".*")
        )

    def seconds_to(self, ended_ms: float) -> float:
        """Seconds from the first handler start noted to `ended_ms`."""
        first = min(start for _, _, start in self.notes_read())
        return max(1e-3, (ended_ms - first) / 1000)

    def notes_read(self) -> list[tuple[float, float, float]]:
        """(due ms, dispatched ms, start ms) of every run the handler noted."""
        out: list[tuple[float, float, float]] = []
        for path in sorted(self.notes.parent.glob(self.notes.name + ".*")):
            values = array.array("d")
            raw = path.read_bytes()
            values.frombytes(raw[: len(raw) - len(raw) % NOTE_BYTES])
            out.extend(zip(values[0::3], values[1::3], values[2::3], strict=True))
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def backlog(client: aioredis.Redis, engine: Engine, tenant: str = TENANT) -> int:
    """Entries in the tenant's ready streams (dispatched and not yet acknowledged)."""
    total = 0
    for shard in engine.store.shards_of(tenant):
        total += int(await client.xlen(engine.keys.stream(shard, tenant, "default")))
    return total


async def wait_handled(
    worker: WorkerProcess,
    client: aioredis.Redis,
    engine: Engine,
    runs: int,
    timeout_s: float,
    tenants: tuple[str, ...] = (TENANT,),
) -> float:
    """Wait until `runs` starts are noted and every entry of the tenants' ready streams
    is acknowledged; returns the worker's CPU seconds at that moment."""
    deadline = time.monotonic() + timeout_s
    while True:
        if worker.noted() >= runs and not any([await backlog(client, engine, t) for t in tenants]):
            return worker.cpu_s()
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {worker.noted()} of {runs} runs handled")
        if worker.proc.poll() is not None:
            raise RuntimeError(f"worker exited:\n{worker.log_path.read_text()[-3000:]}")
        await asyncio.sleep(0.02)


async def redis_cpu_s(client: aioredis.Redis) -> float:
    info: dict[str, Any] = await client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def redis_counters(client: aioredis.Redis) -> dict[str, float]:
    """Redis's CPU (user, sys) and how many reads and writes of clients it served."""
    cpu: dict[str, Any] = await client.info("cpu")
    stats: dict[str, Any] = await client.info("stats")
    return {
        "user_s": float(cpu["used_cpu_user"]),
        "sys_s": float(cpu["used_cpu_sys"]),
        "reads": float(stats["total_reads_processed"]),
        "writes": float(stats["total_writes_processed"]),
    }


async def command_usec(client: aioredis.Redis) -> dict[str, float]:
    """Microseconds Redis spent in each command so far (INFO commandstats); and calls of
    each, as "calls:<command>"."""
    stats: dict[str, Any] = await client.info("commandstats")
    out = {k.removeprefix("cmdstat_"): float(v["usec"]) for k, v in stats.items()}
    out.update({"calls:" + k.removeprefix("cmdstat_"): float(v["calls"]) for k, v in stats.items()})
    return out


def command_share(before: dict[str, float], after: dict[str, float], runs: int) -> dict[str, float]:
    """Redis's microseconds per run in each command that took at least 0.1 of them; and
    "fcall_calls_per_1000_runs" (FCALL calls of every script: acks, and ticks where a
    scheduler runs)."""
    out = {}
    fcalls = after.get("calls:fcall", 0.0) - before.get("calls:fcall", 0.0)
    for name, usec in after.items():
        if name.startswith("calls:"):
            continue
        per_run_us = (usec - before.get(name, 0.0)) / runs
        if per_run_us >= 0.1:
            out[name] = round(per_run_us, 1)
    ordered = dict(sorted(out.items(), key=lambda kv: -kv[1]))
    ordered["fcall_calls_per_1000_runs"] = round(fcalls / runs * 1000, 1)
    return ordered


def per_run(before: dict[str, float], after: dict[str, float], runs: int) -> dict[str, float]:
    return {
        "redis_user_us_per_run": round((after["user_s"] - before["user_s"]) / runs * 1e6, 1),
        "redis_sys_us_per_run": round((after["sys_s"] - before["sys_s"]) / runs * 1e6, 1),
        "redis_client_reads_per_1000_runs": round((after["reads"] - before["reads"]) / runs * 1000),
    }


def lag_figures(notes: list[tuple[float, float, float]]) -> dict[str, Any]:
    """The start lag (start - due), and its two parts: the dispatch lag (the stream
    entry's dispatched_ms - due: the scheduler's share) and the pickup lag (start -
    dispatched_ms: the worker's share, reading included)."""
    lags = sorted(start - due for due, _, start in notes)
    dispatch = sorted(sent - due for due, sent, _ in notes)
    pickup = sorted(start - sent for _, sent, start in notes)
    return {
        "lag_p50_ms": round(percentile(lags, 50), 1),
        "lag_p99_ms": round(percentile(lags, 99), 1),
        "lag_max_ms": round(lags[-1], 1) if lags else None,
        "dispatch_lag_p50_ms": round(percentile(dispatch, 50), 1),
        "dispatch_lag_p99_ms": round(percentile(dispatch, 99), 1),
        "pickup_lag_p50_ms": round(percentile(pickup, 50), 1),
        "pickup_lag_p99_ms": round(percentile(pickup, 99), 1),
        "pickup_lag_max_ms": round(pickup[-1], 1) if pickup else None,
    }


# -- a. the herd ------------------------------------------------------------------------


async def herd(url: str, work: Path, runs: int, processes: int) -> dict[str, Any]:
    engine = await Engine.connect(settings_for(url))
    client = engine.client
    assert isinstance(client, aioredis.Redis)
    await engine.store.scripts.library.load(client)
    sched = scheduler_process(engine.settings, "bench-node", work / "scheduler.log")
    worker = WorkerProcess(url, work, processes, CONCURRENCY)
    try:
        await worker.wait_started()
        await asyncio.sleep(1.0)  # the scheduler holds its shards
        lead_ms = int(runs / LOAD_RATE_GUESS * 1000) + 4_000
        t0 = await server_ms(client) + lead_ms
        t0 -= t0 % 1000  # a whole second, like midnight
        tasks = [
            NewTask(tenant=TENANT, payload_json=payload_json(i), run_at_ms=i % 1000)
            for i in range(runs)
        ]
        await load_herd(url, engine, tasks, t0)
        if await server_ms(client) >= t0 - 200:
            raise RuntimeError("the load ended after T0: raise the lead")
        await asyncio.sleep(max(0.0, (t0 - 100 - await server_ms(client)) / 1000))
        cpu0, redis0 = worker.cpu_s(), await redis_cpu_s(client)
        sched0 = process_cpu_s(sched.pid)
        counters0, usec0 = await redis_counters(client), await command_usec(client)
        if WORKER_CALLGRIND is not None:
            worker.callgrind().start()
        cpu1 = await wait_handled(worker, client, engine, runs, 120)
        instructions = (
            worker.callgrind().instructions(f"herd-{processes}")
            if WORKER_CALLGRIND is not None
            else None
        )
        redis1, sched1 = await redis_cpu_s(client), process_cpu_s(sched.pid)
        counters1, usec1 = await redis_counters(client), await command_usec(client)
    finally:
        worker.stop()
        sched.terminate()
        sched.wait(20)
        await engine.close()
    notes = worker.notes_read()
    starts = sorted(start for _, _, start in notes)
    target = HERD_TARGET_MS.get(processes)
    last = round(starts[-1] - t0) if starts else None
    return {
        "runs": runs,
        "processes": processes,
        "concurrency": concurrency_of(processes),
        "handled": len(notes),
        "first_start_ms": round(starts[0] - t0) if starts else None,
        "last_start_ms": last,
        **lag_figures(notes),
        "worker_cpu_us_per_run": round((cpu1 - cpu0) / runs * 1e6, 1),
        "worker_instructions_per_run": round(instructions / runs) if instructions else None,
        "redis_cpu_us_per_run": round((redis1 - redis0) / runs * 1e6, 1),
        "scheduler_cpu_us_per_run": round((sched1 - sched0) / runs * 1e6, 1),
        **per_run(counters0, counters1, runs),
        "redis_command_us_per_run": command_share(usec0, usec1, runs),
        "target_last_start_ms": target,
        "met": last is not None and target is not None and last <= target,
    }


def concurrency_of(processes: int) -> str:
    return f"{CONCURRENCY} per process" if processes > 1 else str(CONCURRENCY)


# -- b. steady --------------------------------------------------------------------------


def load_main(url: str, rate: int, seconds: float) -> None:
    """The hidden `_load` sub-command: `rate` creates/s, a batch every 10 ms, each due 1 s
    after its create; open loop (a late reply makes the next batch bigger)."""

    async def main() -> None:
        engine = await Engine.connect(settings_for(url))
        pipe = await RawPipe.open(url)
        await engine.store.scripts.library.load(engine.client)
        loop = asyncio.get_running_loop()
        created, begin = 0, loop.time()
        try:
            for k in range(1, 10 * round(seconds * 100) + 1):  # bounded; ends by time
                await asyncio.sleep(max(0.0, begin + k * 0.01 - loop.time()))
                elapsed = min(loop.time() - begin, seconds)
                want = min(round(rate * elapsed) - created, 2000)
                if want > 0:
                    news = [
                        NewTask(
                            tenant=TENANT, payload_json=payload_json(created + i), delay_ms=1000
                        )
                        for i in range(want)
                    ]
                    commands, _ = create_commands(engine, news)
                    await pipe.call(commands)
                    created += want
                if loop.time() - begin >= seconds:
                    break
        finally:
            await pipe.close()
            await engine.close()
        print("RESULT " + json.dumps({"created": created, "seconds": loop.time() - begin}))

    asyncio.run(main())


async def steady(url: str, work: Path, rate: int, seconds: float) -> dict[str, Any]:
    engine = await Engine.connect(settings_for(url))
    client = engine.client
    assert isinstance(client, aioredis.Redis)
    await engine.store.scripts.library.load(client)
    sched = scheduler_process(engine.settings, "bench-node", work / "scheduler.log")
    worker = WorkerProcess(url, work, 1, CONCURRENCY)
    try:
        await worker.wait_started()
        await asyncio.sleep(1.0)
        cpu0, redis0 = worker.cpu_s(), await redis_cpu_s(client)
        gen = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "_load",
            "--url",
            url,
            "--rate",
            str(rate),
            "--seconds",
            str(seconds),
            stdout=asyncio.subprocess.PIPE,
            env=process_env(),
        )
        out, _ = await gen.communicate()
        line = [x for x in out.decode().splitlines() if x.startswith("RESULT ")][-1]
        created = int(json.loads(line[len("RESULT ") :])["created"])
        cpu1 = await wait_handled(worker, client, engine, created, 60)
        redis1 = await redis_cpu_s(client)
    finally:
        worker.stop()
        sched.terminate()
        sched.wait(20)
        await engine.close()
    notes = worker.notes_read()
    figures = lag_figures(notes)
    return {
        "rate": rate,
        "seconds": seconds,
        "created": created,
        "handled": len(notes),
        "concurrency": CONCURRENCY,
        **figures,
        "worker_cpu_us_per_run": round((cpu1 - cpu0) / created * 1e6, 1),
        "redis_cpu_us_per_run": round((redis1 - redis0) / created * 1e6, 1),
        "target_lag_p99_ms": STEADY_P99_TARGET_MS,
        "met": figures["lag_p99_ms"] <= STEADY_P99_TARGET_MS and len(notes) >= created,
    }


# -- c. backlog -------------------------------------------------------------------------


async def primed_engine(url: str) -> tuple[Engine, aioredis.Redis]:
    """An engine on a fresh server, its library loaded and every shard promoted once (as
    a scheduler does at start), and its client."""
    engine = await Engine.connect(settings_for(url))
    client = engine.client
    assert isinstance(client, aioredis.Redis)
    await engine.store.scripts.library.load(client)
    for shard in range(SHARDS):
        await engine.dispatch.promote(shard)
    return engine, client


async def dispatched_backlog(url: str, engine: Engine, tenant: str, runs: int) -> None:
    """`runs` runs of the tenant created and dispatched into its ready streams."""
    client = engine.client
    assert isinstance(client, aioredis.Redis)

    def batches() -> Iterator[list[bytes]]:
        for start in range(0, runs, 2000):
            news = [
                NewTask(tenant=tenant, payload_json=payload_json(i), delay_ms=0)
                for i in range(start, min(runs, start + 2000))
            ]
            yield create_commands(engine, news)[0]

    pipe = await RawPipe.open(url)
    try:
        await pipe.run(batches())
    finally:
        await pipe.close()
    for shard in engine.store.shards_of(tenant):
        while (await engine.dispatch.tick(shard, limit=5000)).dispatched:
            pass
    if await backlog(client, engine, tenant) != runs:
        raise RuntimeError(f"not every run of {tenant} is in the ready streams")


async def drain_backlog(url: str, work: Path, runs: int) -> dict[str, Any]:
    engine, client = await primed_engine(url)
    await dispatched_backlog(url, engine, TENANT, runs)
    worker = WorkerProcess(url, work, 1, CONCURRENCY)
    try:
        await worker.wait_started()
        cpu0, redis0 = worker.cpu_s(), await redis_cpu_s(client)
        usec0 = await command_usec(client)
        cpu1 = await wait_handled(worker, client, engine, runs, 300)
        ended_ms = time.time() * 1000
        redis1 = await redis_cpu_s(client)
        usec1 = await command_usec(client)
    finally:
        worker.stop()
        await engine.close()
    seconds = worker.seconds_to(ended_ms)
    return {
        "runs": runs,
        "concurrency": CONCURRENCY,
        "handled": worker.noted(),
        "seconds": round(seconds, 2),
        "runs_per_s": round(runs / seconds),
        "worker_cpu_us_per_run": round((cpu1 - cpu0) / runs * 1e6, 1),
        "redis_cpu_us_per_run": round((redis1 - redis0) / runs * 1e6, 1),
        "redis_command_us_per_run": command_share(usec0, usec1, runs),
    }


# -- e. pairs --------------------------------------------------------------------------

PAIRS_MANY = 8
PAIRS_SLOW = ("slow", 500, 1.0)
"""The slow tenant of the "slow" part: its runs, and each one's seconds in the handler."""
PAIRS_FAST = ("fast", 20_000)


async def pairs_many(url: str, work: Path, runs: int) -> dict[str, Any]:
    """PAIRS_MANY tenants' backlogs of runs / PAIRS_MANY each, one worker serving all."""
    engine, client = await primed_engine(url)
    tenants = tuple(f"pair-{i}" for i in range(PAIRS_MANY))
    for tenant in tenants:
        await dispatched_backlog(url, engine, tenant, runs // PAIRS_MANY)
    total = runs // PAIRS_MANY * PAIRS_MANY
    worker = WorkerProcess(url, work, 1, CONCURRENCY, tenants=tenants)
    try:
        await worker.wait_started()
        cpu0 = worker.cpu_s()
        cpu1 = await wait_handled(worker, client, engine, total, 300, tenants)
        ended_ms = time.time() * 1000
    finally:
        worker.stop()
        await engine.close()
    seconds = worker.seconds_to(ended_ms)
    return {
        "tenants": PAIRS_MANY,
        "runs": total,
        "concurrency": CONCURRENCY,
        "seconds": round(seconds, 2),
        "runs_per_s": round(total / seconds),
        "worker_cpu_us_per_run": round((cpu1 - cpu0) / total * 1e6, 1),
    }


async def pairs_slow(url: str, work: Path) -> dict[str, Any]:
    """A slow tenant beside a fast one: when the fast one's runs are all acknowledged."""
    engine, client = await primed_engine(url)
    (slow, slow_runs, slow_s), (fast, fast_runs) = PAIRS_SLOW, PAIRS_FAST
    await dispatched_backlog(url, engine, slow, slow_runs)
    await dispatched_backlog(url, engine, fast, fast_runs)
    worker = WorkerProcess(
        url,
        work,
        1,
        CONCURRENCY,
        tenants=(slow, fast),
        app="worker_app:slow_some",
        env={"TW_BENCH_SLOW_TENANTS": slow, "TW_BENCH_SLOW_S": str(slow_s)},
    )
    try:
        await worker.wait_started()
        started = time.monotonic()
        await wait_handled(worker, client, engine, fast_runs, 300, (fast,))
        fast_done_s = time.monotonic() - started
        slow_left = await backlog(client, engine, slow)
    finally:
        worker.stop()
        await engine.close()
    return {
        "slow": {"tenant": slow, "runs": slow_runs, "handler_s": slow_s},
        "fast": {"tenant": fast, "runs": fast_runs},
        "concurrency": CONCURRENCY,
        "fast_done_s": round(fast_done_s, 2),
        "slow_runs_left_then": slow_left,
        "slow_alone_s": round(slow_runs * slow_s / CONCURRENCY, 1),
    }


# -- d. runners ------------------------------------------------------------------------
#
# What it costs to run a no-op handler with bounded concurrency, without Redis: a task per
# run (what the worker did) against a fixed pool of runner coroutines taking runs from a
# deque (what it does, same wake-up rule: one idle runner woken at a time); for plain
# functions, asyncio.to_thread per run against threads of the worker's own taking runs
# from a queue and handing their ends back in batches. CPU per run, in this process.


async def _noop(d: int) -> None:
    return None


def _noop_sync(d: int) -> None:
    return None


async def _tasks_per_run(runs: int, slots: int) -> int:
    in_flight: set[asyncio.Task[None]] = set()
    done = 0

    async def handle(d: int) -> None:
        nonlocal done
        await _noop(d)
        done += 1

    i = 0
    while i < runs:
        free = slots - len(in_flight)
        if free <= 0:
            await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
            continue
        for d in range(i, min(runs, i + free)):
            task = asyncio.create_task(handle(d))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        i += free
        await asyncio.sleep(0)
    await asyncio.gather(*in_flight)
    return done


async def _runner_pool(runs: int, slots: int, concurrency: int) -> int:
    loop = asyncio.get_running_loop()
    buffer: collections.deque[int] = collections.deque()
    idle: collections.deque[asyncio.Future[None]] = collections.deque()
    state = {"done": 0, "waking": 0, "finished": 0}

    def wake() -> None:
        idle.popleft().set_result(None)
        state["waking"] += 1

    async def runner() -> None:
        while True:
            if not buffer:
                if state["finished"]:
                    return
                waiter = loop.create_future()
                idle.append(waiter)
                await waiter
                state["waking"] -= 1
                continue
            d = buffer.popleft()
            if buffer and idle and not state["waking"]:
                wake()
            await _noop(d)
            state["done"] += 1

    runners = [asyncio.create_task(runner()) for _ in range(concurrency)]
    await asyncio.sleep(0)
    for i in range(0, runs, slots):
        buffer.extend(range(i, min(runs, i + slots)))
        if idle and not state["waking"]:
            wake()
        await asyncio.sleep(0)
    state["finished"] = 1
    while idle:
        wake()
    await asyncio.gather(*runners)
    return state["done"]


async def _to_thread_per_run(runs: int, concurrency: int) -> int:
    slots = asyncio.Semaphore(concurrency)
    done = 0

    async def handle(d: int) -> None:
        nonlocal done
        async with slots:
            await asyncio.to_thread(_noop_sync, d)
            done += 1

    await asyncio.gather(*(handle(d) for d in range(runs)))
    return done


async def _thread_pool(runs: int, slots: int, concurrency: int) -> int:
    loop = asyncio.get_running_loop()
    inbox: queue.SimpleQueue[int | None] = queue.SimpleQueue()
    ends: collections.deque[int] = collections.deque()
    state = {"pending": 0, "done": 0}
    all_done = loop.create_future()

    def collect() -> None:
        state["pending"] = 0
        while ends:
            ends.popleft()
            state["done"] += 1
        if state["done"] >= runs and not all_done.done():
            all_done.set_result(None)

    def main() -> None:
        while (d := inbox.get()) is not None:
            _noop_sync(d)
            ends.append(d)
            if not state["pending"]:
                state["pending"] = 1
                loop.call_soon_threadsafe(collect)

    threads = [threading.Thread(target=main, daemon=True) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    sent = 0
    while sent < runs:
        while sent < runs and sent - state["done"] < slots:
            inbox.put(sent)
            sent += 1
        await asyncio.sleep(0.0005)
    await all_done
    for _ in threads:
        inbox.put(None)
    for thread in threads:
        thread.join()
    return state["done"]


def runners(runs: int) -> dict[str, Any]:
    import uvloop

    slots = 2 * CONCURRENCY  # concurrency plus the default prefetch
    ways: dict[str, Callable[[], Coroutine[Any, Any, int]]] = {
        "async: a task per run": lambda: _tasks_per_run(runs, slots),
        "async: runner pool": lambda: _runner_pool(runs, slots, CONCURRENCY),
        "plain: asyncio.to_thread per run": lambda: _to_thread_per_run(runs // 5, CONCURRENCY),
        "plain: handler threads": lambda: _thread_pool(runs // 5, slots, CONCURRENCY),
    }
    out: dict[str, Any] = {"runs": runs, "concurrency": CONCURRENCY}
    for name, way in [*ways.items(), *ways.items()]:  # twice, interleaved: the best
        before = time.process_time()
        done = uvloop.run(way())
        us = (time.process_time() - before) / done * 1e6
        out[name] = round(min(us, out.get(name, us)), 2)
    return out


# -- main -------------------------------------------------------------------------------


def on_fresh_server(root: Path, name: str, work: Any, *args: Any) -> dict[str, Any]:
    data = root / name
    data.mkdir()
    server = RedisServer(data / "redis", appendfsync="always")
    server.start()
    try:
        gauge = asyncio.run(host_gauge(server.url))
        result: dict[str, Any] = asyncio.run(work(server.url, data, *args))
        result["host_gauge"] = gauge
        return result
    finally:
        server.stop()
        shutil.rmtree(data, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="?", default="all", choices=["all", "_load"])
    parser.add_argument("--url")
    parser.add_argument("--parts", default="herd,steady,backlog,runners,pairs")
    parser.add_argument("--processes", default="1,2", help="herd runs with these (default 1,2)")
    parser.add_argument("--runs", type=int, default=100_000, help="herd runs (default 100,000)")
    parser.add_argument("--backlog-runs", type=int, default=200_000)
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--prefetch", type=int, help="the workers' --prefetch")
    parser.add_argument(
        "--worker-callgrind",
        action="store_true",
        help="herd: count the worker process's instructions per run under callgrind "
        "(one process; use --runs 5000 or so: valgrind is some 50 times slower)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.command == "_load":
        load_main(args.url, args.rate, args.seconds)
        return
    global PREFETCH, WORKER_CALLGRIND
    PREFETCH = args.prefetch
    if args.quick:
        args.runs, args.backlog_runs, args.seconds = 10_000, 20_000, 10.0
    parts = args.parts.split(",")
    result: dict[str, Any] = {
        "parameters": {
            "shards": SHARDS,
            "spread": SPREAD,
            "appendfsync": "always",
            "concurrency": CONCURRENCY,
            "handler": "worker_app:noop (async)",
        }
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if args.worker_callgrind:
            WORKER_CALLGRIND = root / "callgrind"
            WORKER_CALLGRIND.mkdir()
        if "herd" in parts:
            result["herd"] = [
                on_fresh_server(root, f"herd-{n}", herd, args.runs, int(n))
                for n in args.processes.split(",")
            ]
            for h in result["herd"]:
                print(
                    f"herd, {h['processes']} process(es): last start {h['last_start_ms']} ms "
                    f"after T0 (first {h['first_start_ms']}), lag p50 {h['lag_p50_ms']} / "
                    f"p99 {h['lag_p99_ms']} ms, worker {h['worker_cpu_us_per_run']} us/run, "
                    f"scheduler {h['scheduler_cpu_us_per_run']} us/run, "
                    f"Redis {h['redis_cpu_us_per_run']} us/run (sys {h['redis_sys_us_per_run']}, "
                    f"{h['redis_client_reads_per_1000_runs']} reads/1000 runs) "
                    f"({h['handled']}/{h['runs']})"
                    + (
                        f", worker {h['worker_instructions_per_run']:,} instructions/run"
                        if h.get("worker_instructions_per_run")
                        else ""
                    ),
                    flush=True,
                )
        if "steady" in parts:
            s = result["steady"] = on_fresh_server(root, "steady", steady, args.rate, args.seconds)
            print(
                f"steady {s['rate']}/s: lag p50 {s['lag_p50_ms']} / p99 {s['lag_p99_ms']} / max "
                f"{s['lag_max_ms']} ms, worker {s['worker_cpu_us_per_run']} us/run, Redis "
                f"{s['redis_cpu_us_per_run']} us/run ({s['handled']}/{s['created']})",
                flush=True,
            )
        if "backlog" in parts:
            b = result["backlog"] = on_fresh_server(
                root, "backlog", drain_backlog, args.backlog_runs
            )
            print(
                f"backlog: {b['runs_per_s']} runs/s, worker {b['worker_cpu_us_per_run']} us/run, "
                f"Redis {b['redis_cpu_us_per_run']} us/run ({b['handled']}/{b['runs']})",
                flush=True,
            )
        if "pairs" in parts:
            m = on_fresh_server(root, "pairs-many", pairs_many, args.runs)
            w = on_fresh_server(root, "pairs-slow", pairs_slow)
            result["pairs"] = {"many": m, "slow": w}
            print(
                f"pairs: {m['tenants']} tenants, {m['runs_per_s']} runs/s, worker "
                f"{m['worker_cpu_us_per_run']} us/run; beside a tenant of "
                f"{w['slow']['runs']} runs of {w['slow']['handler_s']} s, the fast tenant's "
                f"{w['fast']['runs']} runs done after {w['fast_done_s']} s (the slow ones "
                f"alone: {w['slow_alone_s']} s; {w['slow_runs_left_then']} left then)",
                flush=True,
            )
    if "runners" in parts:
        r = result["runners"] = runners(args.backlog_runs)
        print(
            "runners, CPU per run: "
            + ", ".join(f"{k} {v} us" for k, v in r.items() if k.startswith(("async", "plain"))),
            flush=True,
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
