"""Dispatch throughput and dispatch lag, each on a fresh redis-server with AOF appendfsync always.

a. throughput: N runs already due (run_at in the past, 1000 tenants, 64 shards, 100-byte
   payload) are loaded, every shard is promoted until done (timed apart), then ONE
   Scheduler(engine.store) runs in this process; the figure is the time from its start until
   counters.dispatched reaches N. Target >= 75,000/s.
b. lag: a scheduler process is started, then a load-generator process creates tasks at
   a steady rate (default 10,000/s for 30 s, a batch every 10 ms, 1000 tenants), each due
   1 s after its create (delay_ms=1000, so due_ms comes from the Redis clock). Once all
   are dispatched every ready stream is read: lag = dispatched_ms - due_ms (p50, p99,
   max), and every created run must be dispatched exactly once. Targets: p99 <= 25 ms,
   max <= 100 ms.

Loads build each create exactly as Engine.create_many does (Engine._prepare: same script,
keys and arguments) and pipeline it on a plain connection with hiredis parsing: the
redis-py pipeline path costs ~50-90 us of Python per create on this machine, more than
the create itself (`--client engine` uses Engine.create_many instead). The lag load is
open loop: a reply that comes late makes the next batch bigger (up to MAX_LOAD_BATCH).

`--cluster` runs both parts on a 3-primary Redis Cluster instead, with 1 and with 3
scheduler processes holding shards by lease, and reads Redis CPU per primary
(bench/dispatch_cluster.py; writes bench/results/dispatch-cluster.json).

Run:  .venv/bin/python bench/dispatch.py            (1,000,000 runs; 10,000/s for 30 s)
      .venv/bin/python bench/dispatch.py --quick    (100,000 runs; lag part unchanged)
      .venv/bin/python bench/dispatch.py --cluster --runs 300000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from common import percentile
from rawpipe import ClusterPipes, RawPipe, create_commands, create_commands_keyed

from timewheel.config import Settings
from timewheel.dispatch.scheduler import Scheduler
from timewheel.engine import Engine
from timewheel.store.server import RedisServer
from timewheel.tasks.model import NewTask

PAYLOAD_BYTES = 100
SHARDS = 64
TENANTS = 1000
RESULTS = Path(__file__).resolve().parent / "results" / "dispatch.json"
THROUGHPUT_TARGET = 75_000
LAG_P99_TARGET_MS = 25
LAG_MAX_TARGET_MS = 100
MAX_LOAD_BATCH = 2000
MAIN_THREAD_CPU = ("used_cpu_user_main_thread", "used_cpu_sys_main_thread")
_PAD = "x" * (PAYLOAD_BYTES - len('"task-0000000000-"'))


def payload_json(i: int) -> str:
    """A JSON string whose encoded JSON is exactly PAYLOAD_BYTES bytes (for i < 10**10)."""
    return f'"task-{i:010d}-{_PAD}"'


def tenant_names(count: int = TENANTS) -> list[str]:
    return [f"tenant-{i:04d}" for i in range(count)]


def settings_for(url: str) -> Settings:
    # No continuous audit: a scheduler with a node id would run it, and its canary runs
    # would be in the streams these benches count.
    return Settings(redis_url=url, shards=SHARDS, audit_interval_ms=0)


def plain(engine: Engine) -> aioredis.Redis:
    """The engine's client; these benches run on standalone Redis."""
    client = engine.client
    if not isinstance(client, aioredis.Redis):
        raise RuntimeError("the dispatch bench runs on standalone Redis")
    return client


async def load_scripts(engine: Engine) -> None:
    await engine.store.scripts.library.load(engine.client)


async def server_ms(client: aioredis.Redis) -> int:
    sec, usec = await client.time()
    return int(sec) * 1000 + int(usec) // 1000


async def info_section(client: aioredis.Redis, section: str) -> dict[str, Any]:
    info: dict[str, Any] = await client.info(section)
    return info


# -- a. throughput -------------------------------------------------------------------


async def load_due(engine: Engine, url: str, runs: int, batch: int) -> float:
    """Create `runs` tasks due in the last minute (they land in far buckets); returns s."""
    now = await server_ms(plain(engine))
    tenants = tenant_names()
    rng = random.Random(1)

    def batches() -> Iterator[list[bytes]]:
        for start in range(0, runs, batch):
            news = [
                NewTask(
                    tenant=tenants[i % TENANTS],
                    payload_json=payload_json(i),
                    run_at_ms=now - 1_000 - rng.randrange(60_000),
                )
                for i in range(start, min(start + batch, runs))
            ]
            yield create_commands(engine, news)[0]

    started = time.perf_counter()
    pipe = await RawPipe.open(url)
    try:
        await pipe.run(batches())
    finally:
        await pipe.close()
    return time.perf_counter() - started


async def promote_all(
    engine: Engine, deadline: float, concurrency: int = 8
) -> tuple[float, int, int]:
    """Promote every shard until nothing is left; returns (seconds, runs moved, calls).

    A few shards at a time: 64 calls queued behind one another (each moves up to
    promote_batch runs) could outlast the client's 5 s socket timeout.
    """
    moved = calls = 0
    gate = asyncio.Semaphore(concurrency)

    async def one(shard: int) -> None:
        async with gate:
            await drain(shard)

    async def drain(shard: int) -> None:
        nonlocal moved, calls
        while time.monotonic() < deadline:
            res = await engine.dispatch.promote(shard)
            moved += res.moved
            calls += 1
            if not res.more:
                return
        raise TimeoutError(f"promote of shard {shard} did not finish in time")

    started = time.perf_counter()
    await asyncio.gather(*(one(s) for s in range(SHARDS)))
    return time.perf_counter() - started, moved, calls


async def wait_for_rewrite(client: aioredis.Redis, deadline: float) -> None:
    """Let an AOF rewrite started by the load finish before the timed phase."""
    while time.monotonic() < deadline:
        info = await info_section(client, "persistence")
        if not int(info.get("aof_rewrite_in_progress", 0)) and not int(
            info.get("aof_rewrite_scheduled", 0)
        ):
            return
        await asyncio.sleep(0.1)


async def latency_latest(client: aioredis.Redis) -> dict[str, dict[str, int]]:
    """LATENCY LATEST: per event, the latest and the worst stall in ms (threshold 20 ms)."""
    rows: list[Any] = await client.execute_command("LATENCY", "LATEST")  # type: ignore[no-untyped-call]
    return {
        (row[0].decode() if isinstance(row[0], bytes) else str(row[0])): {
            "latest_ms": int(row[2]),
            "max_ms": int(row[3]),
        }
        for row in rows
    }


def stat_usec(stats: dict[str, Any], command: str) -> tuple[int, int]:
    entry = stats.get(f"cmdstat_{command}") or {}
    return int(entry.get("calls", 0)), int(entry.get("usec", 0))


async def time_scheduler(engine: Engine, runs: int, timeout_s: float) -> dict[str, Any]:
    """Run one Scheduler until it has dispatched `runs`; returns timings and Redis stats."""
    client = plain(engine)
    await client.config_resetstat()
    cpu0 = await info_section(client, "cpu")
    persistence0 = await info_section(client, "persistence")
    scheduler = Scheduler(engine.store)
    stop = asyncio.Event()
    proc0 = time.process_time()
    started = time.perf_counter()
    task = asyncio.create_task(scheduler.run(stop))
    deadline = started + timeout_s
    completed_by = "counter"
    next_count = started + 0.5
    try:
        while scheduler.counters.dispatched < runs and time.perf_counter() < deadline:
            if task.done():
                task.result()
                raise RuntimeError("the scheduler stopped early")
            await asyncio.sleep(0.002)
            # A tick that timed out on the client still ran: its runs are in the streams
            # but not in the counter. Only then are the streams counted.
            if scheduler.counters.errors and time.perf_counter() >= next_count:
                next_count = time.perf_counter() + 0.5
                if await count_stream_entries(client) >= runs:
                    completed_by = "streams"
                    break
        elapsed = time.perf_counter() - started
    finally:
        stop.set()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(task, 10)
    py_cpu = time.process_time() - proc0
    stats = await info_section(client, "commandstats")
    cpu1 = await info_section(client, "cpu")
    persistence1 = await info_section(client, "persistence")
    calls, usec = stat_usec(stats, "fcall")
    # Commands run inside the scripts are counted too (Redis >= 7): where the Lua time goes.
    inner = sorted(
        (
            (name.removeprefix("cmdstat_"), int(v["calls"]), int(v["usec"]))
            for name, v in stats.items()
            if isinstance(v, dict) and name != "cmdstat_fcall"
        ),
        key=lambda t: -t[2],
    )
    redis_cpu = sum(float(cpu1[k]) - float(cpu0[k]) for k in MAIN_THREAD_CPU)
    dispatched = scheduler.counters.dispatched
    if completed_by == "streams":
        dispatched = runs
    return {
        "dispatched": dispatched,
        "dispatched_counter": scheduler.counters.dispatched,
        "completed_by": completed_by,
        "complete": dispatched >= runs,
        "seconds": round(elapsed, 3),
        "per_s": round(dispatched / elapsed),
        "ticks": scheduler.counters.ticks,
        "scheduler_errors": scheduler.counters.errors,
        "lua_calls": calls,
        "lua_seconds": round(usec / 1e6, 3),
        "lua_us_per_run": round(usec / max(dispatched, 1), 2),
        "commands_per_run": {
            name: {
                "calls": round(n / max(dispatched, 1), 3),
                "us": round(us / max(dispatched, 1), 2),
            }
            for name, n, us in inner[:12]
        },
        "redis_main_thread_cpu_s": round(redis_cpu, 2),
        "scheduler_process_cpu_s": round(py_cpu, 2),
        "aof_rewrites_during": int(persistence1.get("aof_rewrites", 0))
        - int(persistence0.get("aof_rewrites", 0)),
    }


async def throughput(url: str, runs: int, batch: int, timeout_s: float) -> dict[str, Any]:
    engine = await Engine.connect(settings_for(url))
    try:
        await load_scripts(engine)
        client = plain(engine)
        load_s = await load_due(engine, url, runs, batch)
        print(f"  throughput: loaded {runs:,} due runs in {load_s:.1f} s", flush=True)
        deadline = time.monotonic() + timeout_s
        await wait_for_rewrite(client, deadline)
        promote_s, moved, calls = await promote_all(engine, deadline)
        print(f"  throughput: promoted {moved:,} runs in {promote_s:.2f} s", flush=True)
        await wait_for_rewrite(client, deadline)
        result = await time_scheduler(engine, runs, max(deadline - time.monotonic(), 1.0))
        streams = await count_stream_entries(client)
        result["latency_latest"] = await latency_latest(client)
        result.update(
            {
                "runs": runs,
                "load_seconds": round(load_s, 2),
                "load_per_s": round(runs / load_s),
                "promote_seconds": round(promote_s, 3),
                "promoted": moved,
                "promote_calls": calls,
                "promote_per_s": round(moved / promote_s) if promote_s else None,
                "stream_entries": streams,
                "target_per_s": THROUGHPUT_TARGET,
                "met": result["per_s"] >= THROUGHPUT_TARGET and result["complete"],
            }
        )
        return result
    finally:
        await engine.close()


async def stream_keys(client: aioredis.Redis, prefix: str = "tw") -> list[str]:
    found = []
    async for raw in client.scan_iter(match=f"{{{prefix}:*}}:q:*", count=1000):
        found.append(raw.decode())
    return found


async def count_stream_entries(client: aioredis.Redis) -> int:
    keys = await stream_keys(client)
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.xlen(key)
    return sum(int(n) for n in await pipe.execute())


# -- b. lag: child processes -----------------------------------------------------------


async def scheduler_process(
    url: str, max_seconds: float, node: str | None = None, wait_go: bool = False
) -> None:
    """The hidden `_schedule` sub-command: run one Scheduler until SIGTERM (or max_seconds).

    With `node` it is a fenced node that claims its share of the shards by lease. With
    `wait_go` it announces itself in the membership (so every node's first lease round
    sees every other) and starts only on SIGUSR1; then it notes the wall time of its
    first and last dispatch and the shards it held, for a drain timed across processes.
    """
    engine = await Engine.connect(settings_for(url))
    stop, go = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, go.set)
    scheduler = Scheduler(engine.store, node=node)
    drain: dict[str, Any] = {}
    try:
        if wait_go:
            leases = scheduler.ownership.leases
            print("READY", flush=True)
            while not go.is_set() and not stop.is_set():
                if leases is not None:
                    await leases.members()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(go.wait(), 0.25)
            drain["go_wall"] = time.time()
        cpu0 = time.process_time()
        task = asyncio.create_task(scheduler.run(stop))
        watch = asyncio.create_task(watch_dispatches(scheduler, stop, drain)) if wait_go else None
        if not wait_go:
            print("READY", flush=True)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), max_seconds)
        stop.set()
        await asyncio.wait_for(task, 10)
        if watch is not None:
            await watch
    finally:
        await engine.close()
    result = {
        **asdict(scheduler.counters),
        **drain,
        "node": node,
        "cpu_s": round(time.process_time(), 2),
        "run_cpu_s": round(time.process_time() - cpu0, 2),
    }
    print("RESULT " + json.dumps(result), flush=True)


async def watch_dispatches(scheduler: Scheduler, stop: asyncio.Event, out: dict[str, Any]) -> None:
    """Every 5 ms: note when the dispatched counter first and last moved, and the shards
    held when it last moved."""
    seen = 0
    while not stop.is_set():
        count = scheduler.counters.dispatched
        if count != seen:
            now = time.time()
            out.setdefault("first_dispatch_wall", now)
            out["last_dispatch_wall"] = now
            out["shards_held"] = sorted(scheduler.state)
            seen = count
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.005)


async def load_process(
    url: str,
    rate: int,
    seconds: float,
    interval_ms: int,
    ids_path: Path,
    client_kind: str,
    cluster: bool = False,
) -> None:
    """The hidden `_load` sub-command: create at `rate`/s for `seconds`, each due 1 s later.

    Open loop: every `interval_ms` it sends every create owed by then (rate x elapsed
    minus created, at most MAX_LOAD_BATCH), so a slow reply makes the next batch bigger
    rather than lowering the offered rate. It stops at `seconds` whatever was achieved.
    On a Cluster (`cluster`) each create goes to its shard's primary, all primaries at once.
    """
    engine = await Engine.connect(settings_for(url))
    pipe: RawPipe | ClusterPipes = await (ClusterPipes if cluster else RawPipe).open(url)
    await load_scripts(engine)
    tenants = tenant_names()
    interval = interval_ms / 1000
    created, batches, catch_up = 0, 0, 0
    latencies: list[float] = []
    all_ids: list[str] = []
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    try:
        for k in range(1, 10 * round(seconds / interval) + 1):  # bounded; ends by time
            wait = t0 + k * interval - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            elapsed = min(loop.time() - t0, seconds)
            want = min(round(rate * elapsed) - created, MAX_LOAD_BATCH)
            if want > 0:
                catch_up += want > 1.5 * rate * interval
                news = [
                    NewTask(
                        tenant=tenants[(created + i) % TENANTS],
                        payload_json=payload_json(created + i),
                        delay_ms=1000,
                    )
                    for i in range(want)
                ]
                sent = time.perf_counter()
                if client_kind == "engine":
                    results = await engine.tasks.create_many(news)
                    all_ids.extend(r.task_id for r in results)
                elif isinstance(pipe, ClusterPipes):
                    keyed, task_ids = create_commands_keyed(engine, news)
                    await pipe.call(keyed)
                    all_ids.extend(task_ids)
                else:
                    commands, task_ids = create_commands(engine, news)
                    await pipe.call(commands)
                    all_ids.extend(task_ids)
                latencies.append(round((time.perf_counter() - sent) * 1000, 3))
                created += want
                batches += 1
            if loop.time() - t0 >= seconds:
                break
        elapsed = loop.time() - t0
    finally:
        await pipe.close()
        await engine.close()
    ids_path.write_text("\n".join(all_ids) + "\n")
    latencies.sort()
    summary = {
        "created": created,
        "offered": round(rate * seconds),
        "seconds": round(elapsed, 3),
        "achieved_per_s": round(created / elapsed),
        "batches": batches,
        "catch_up_batches": catch_up,
        "batch_ms_p50": percentile(latencies, 50),
        "batch_ms_p99": percentile(latencies, 99),
        "batch_ms_max": latencies[-1] if latencies else 0,
        "cpu_s": round(time.process_time(), 2),
    }
    print("RESULT " + json.dumps(summary), flush=True)


# -- b. lag: the parent --------------------------------------------------------------


def spawn(args: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=Path(__file__).resolve().parent.parent,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def result_line(log_path: Path) -> dict[str, Any] | None:
    for line in reversed(log_path.read_text(errors="replace").splitlines()):
        if line.startswith("RESULT "):
            parsed: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return parsed
    return None


async def wait_for_line(
    log_path: Path, text: str, proc: subprocess.Popen[bytes], timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if text in log_path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise RuntimeError(
                f"child exited with {proc.returncode}: {log_path.read_text()[-2000:]}"
            )
        await asyncio.sleep(0.05)
    raise TimeoutError(f"no {text!r} from the child within {timeout_s} s")


async def wait_process(proc: subprocess.Popen[bytes], timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None:
        if time.monotonic() >= deadline:
            raise TimeoutError(f"child {proc.pid} still running after {timeout_s} s")
        await asyncio.sleep(0.1)
    return proc.returncode


async def wait_drained(client: aioredis.Redis, expected: int, timeout_s: float) -> int:
    """Wait until the ready streams hold `expected` entries (or the deadline); returns count."""
    deadline = time.monotonic() + timeout_s
    count = await count_stream_entries(client)
    while count < expected and time.monotonic() < deadline:
        await asyncio.sleep(0.25)
        count = await count_stream_entries(client)
    await asyncio.sleep(0.5)  # anything dispatched twice would show up by now
    return await count_stream_entries(client)


async def read_dispatches(client: aioredis.Redis) -> list[tuple[str, int, int]]:
    """(run_id, due_ms, dispatched_ms) of every entry of every ready stream."""
    out: list[tuple[str, int, int]] = []
    for key in await stream_keys(client):
        start = "-"
        while True:
            page: list[Any] = await client.execute_command(  # type: ignore[no-untyped-call]
                "XRANGE", key, start, "+", "COUNT", 10_000
            )
            for _, fields in page:
                out.append(
                    (
                        fields[b"run_id"].decode(),
                        int(fields[b"due_ms"]),
                        int(fields[b"dispatched_ms"]),
                    )
                )
            if len(page) < 10_000:
                break
            start = "(" + page[-1][0].decode()
    return out


def worst_by_second(dispatches: list[tuple[str, int, int]]) -> list[int]:
    if not dispatches:
        return []
    first = min(due for _, due, _ in dispatches) // 1000
    worst: dict[int, int] = {}
    for _, due, sent in dispatches:
        second = due // 1000 - first
        worst[second] = max(worst.get(second, 0), sent - due)
    return [worst.get(i, 0) for i in range(max(worst) + 1)]


def lag_figures(created_ids: list[str], dispatches: list[tuple[str, int, int]]) -> dict[str, Any]:
    lags = sorted(d - due for _, due, d in dispatches)
    seen: dict[str, int] = {}
    for run_id, _, _ in dispatches:
        seen[run_id] = seen.get(run_id, 0) + 1
    created = set(created_ids)
    return {
        "count": len(lags),
        "p50_ms": percentile(lags, 50),
        "p90_ms": percentile(lags, 90),
        "p99_ms": percentile(lags, 99),
        "p999_ms": percentile(lags, 99.9),
        "max_ms": lags[-1] if lags else None,
        "min_ms": lags[0] if lags else None,
        "over_25_ms": sum(1 for x in lags if x > 25),
        "over_100_ms": sum(1 for x in lags if x > 100),
        # Worst lag per second of due time: spread tails point at load, clustered ones at stalls.
        "max_ms_by_second": worst_by_second(dispatches),
        "created": len(created_ids),
        "created_unique": len(created),
        "duplicates": sum(n - 1 for n in seen.values() if n > 1),
        "missing": len(created - seen.keys()),
        "unexpected": len(seen.keys() - created),
    }


async def lag(url: str, args: argparse.Namespace, work_dir: Path) -> dict[str, Any]:
    sched_log, load_log = work_dir / "scheduler.log", work_dir / "load.log"
    ids_path = work_dir / "created.ids"
    limit = args.seconds + 120
    sched = spawn(["_schedule", "--url", url, "--max-seconds", str(limit)], sched_log)
    load: subprocess.Popen[bytes] | None = None
    client = aioredis.Redis.from_url(url)
    try:
        await wait_for_line(sched_log, "READY", sched, 30)
        await asyncio.sleep(0.5)  # its first pass (promote every shard) is done
        await client.config_resetstat()
        cpu0 = await info_section(client, "cpu")
        persistence0 = await info_section(client, "persistence")
        load = spawn(
            [
                "_load", "--url", url, "--rate", str(args.rate), "--seconds", str(args.seconds),
                "--interval-ms", str(args.interval_ms), "--ids", str(ids_path),
                "--client", args.client,
            ],
            load_log,
        )  # fmt: skip
        code = await wait_process(load, args.seconds + 60)
        load_result = result_line(load_log)
        if code != 0 or load_result is None:
            raise RuntimeError(f"load generator failed ({code}): {load_log.read_text()[-2000:]}")
        created_ids = ids_path.read_text().split()
        stream_entries = await wait_drained(client, len(created_ids), 30)
        stop_process(sched)
        cpu1 = await info_section(client, "cpu")
        stats = await info_section(client, "commandstats")
        figures = lag_figures(created_ids, await read_dispatches(client))
        figures.update(
            {
                "load": load_result,
                "scheduler": result_line(sched_log),
                "stream_entries": stream_entries,
                "redis_main_thread_cpu_s": round(
                    sum(float(cpu1[k]) - float(cpu0[k]) for k in MAIN_THREAD_CPU), 2
                ),
                "redis_fcall": stats.get("cmdstat_fcall"),
                "commands": {
                    name.removeprefix("cmdstat_"): {"calls": v["calls"], "usec": v["usec"]}
                    for name, v in sorted(stats.items(), key=lambda kv: -int(kv[1]["usec"]))[:14]
                },
                "aof_rewrites_during": int(
                    (await info_section(client, "persistence")).get("aof_rewrites", 0)
                )
                - int(persistence0.get("aof_rewrites", 0)),
                "latency_latest": await latency_latest(client),
                "met": (
                    figures["p99_ms"] <= LAG_P99_TARGET_MS
                    and (figures["max_ms"] or 0) <= LAG_MAX_TARGET_MS
                    and figures["duplicates"] == 0
                    and figures["missing"] == 0
                ),
            }
        )
        return figures
    finally:
        if load is not None:
            stop_process(load)
        stop_process(sched)
        await client.aclose()


# -- main ----------------------------------------------------------------------------


def with_server(name: str, root: Path, appendfsync: str) -> RedisServer:
    # The shipped settings (appendfsync always, AOF rewrites on); the latency monitor
    # only records stalls (fsync, fork) for the report.
    return RedisServer(
        root / name,
        port=0,
        appendfsync=appendfsync,
        extra_config={"latency-monitor-threshold": "20"},
    )


async def redis_version(url: str) -> str:
    client = aioredis.Redis.from_url(url)
    try:
        return str((await info_section(client, "server"))["redis_version"])
    finally:
        await client.aclose()


GAUGE_CALLS = 200_000
GAUGE_SCRIPTS = {
    # ns per redis.call from Lua (a 2-argument HGET of a missing key) and per integer
    # formatted by Lua: on the quiet 2-core machine of these figures about 330 and 270.
    "redis_call_ns": "for i = 1, ARGV[1] do redis.call('HGET', 'tw-gauge', 'f') end",
    "lua_format_ns": "for i = 1, ARGV[1] do local x = string.format('%d', 1795989189521 + i) end",
}


async def host_gauge(url: str) -> dict[str, int]:
    """How fast this host runs Redis' Lua right now. The host's speed varies by half
    between runs on a shared machine; this puts a figure beside every result."""
    client = aioredis.Redis.from_url(url)
    out = {}
    try:
        for name, body in GAUGE_SCRIPTS.items():
            started = time.perf_counter()
            await client.eval(body, 0, GAUGE_CALLS)
            out[name] = round((time.perf_counter() - started) / GAUGE_CALLS * 1e9)
        return out
    finally:
        await client.aclose()


def on_fresh_server(
    name: str, root: Path, appendfsync: str, work: Callable[[str], dict[str, Any]]
) -> dict[str, Any]:
    """`work(url)` against a fresh redis-server under root/name (removed after); its
    result gets the server's version and the host gauge taken before it."""
    server = with_server(name, root, appendfsync)
    try:
        server.start()
        version = asyncio.run(redis_version(server.url))
        gauge = asyncio.run(host_gauge(server.url))
        print(f"  {name}: host gauge {gauge}", flush=True)
        result = work(server.url)
        result["redis_version"] = version
        result["host_gauge"] = gauge
        return result
    finally:
        server.stop()
        shutil.rmtree(root / name, ignore_errors=True)


def run_part(name: str, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    def work(url: str) -> dict[str, Any]:
        if name == "throughput":
            return asyncio.run(throughput(url, args.runs, args.batch, args.timeout))
        work_dir = root / "lag-work"
        work_dir.mkdir(parents=True, exist_ok=True)
        return asyncio.run(asyncio.wait_for(lag(url, args, work_dir), args.timeout))

    return on_fresh_server(name, root, args.appendfsync, work)


def throughput_line(r: dict[str, Any]) -> str:
    return (
        f"SUMMARY dispatch throughput: {r['dispatched']:,} of {r['runs']:,} due runs in "
        f"{r['seconds']:.2f} s = {r['per_s']:,}/s by one scheduler process (target >= "
        f"{THROUGHPUT_TARGET:,}/s: {'met' if r['met'] else 'MISSED'}); promote {r['promoted']:,} "
        f"runs in {r['promote_seconds']:.2f} s ({r['promote_calls']} calls); Lua "
        f"{r['lua_us_per_run']} us/run; load {r['load_per_s']:,}/s"
    )


def lag_line(r: dict[str, Any], args: argparse.Namespace) -> str:
    load = r["load"]
    return (
        f"SUMMARY dispatch lag at {args.rate:,}/s offered for {args.seconds:g} s (achieved "
        f"{load['achieved_per_s']:,}/s, {load['created']:,} created, create batch p99 "
        f"{load['batch_ms_p99']:.0f} ms): p50 {r['p50_ms']} ms, "
        f"p99 {r['p99_ms']} ms, max {r['max_ms']} ms over {r['count']:,} dispatches; "
        f"duplicates {r['duplicates']}, missing {r['missing']} (targets p99 <= "
        f"{LAG_P99_TARGET_MS} ms, max <= {LAG_MAX_TARGET_MS} ms: {'met' if r['met'] else 'MISSED'})"
    )


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1_000_000, help="runs for the throughput part")
    parser.add_argument("--quick", action="store_true", help="100,000 runs (smoke run)")
    parser.add_argument("--parts", default="throughput,lag", help="comma list: throughput,lag")
    parser.add_argument("--rate", type=int, default=10_000, help="creates/s in the lag part")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of the lag load")
    parser.add_argument("--interval-ms", type=int, default=10, help="create batch interval")
    parser.add_argument(
        "--client", choices=("raw", "engine"), default="raw", help="how the lag load creates"
    )
    parser.add_argument("--batch", type=int, default=2000, help="creates per load pipeline")
    parser.add_argument(
        "--appendfsync",
        choices=("always", "everysec", "no"),
        default="always",
        help="AOF fsync policy (always is the production setting; others for diagnosis)",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="deadline per part, s")
    parser.add_argument("--data-dir", type=Path, default=None, help="parent of server data dirs")
    parser.add_argument(
        "--out", type=Path, default=None, help=f"JSON results file (default {RESULTS.name})"
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="on a 3-primary Redis Cluster, with scheduler processes holding shards by lease",
    )
    parser.add_argument(
        "--schedulers",
        default="1,3",
        help="with --cluster: comma list of scheduler process counts, each part run per count",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.runs = 100_000
    unknown = set(args.parts.split(",")) - {"throughput", "lag"}
    if unknown:
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}")
    try:
        args.scheduler_counts = [int(n) for n in args.schedulers.split(",")]
    except ValueError:
        parser.error(f"--schedulers {args.schedulers!r}: give a comma list of counts, e.g. 1,3")
    if not args.scheduler_counts or not all(1 <= n <= SHARDS for n in args.scheduler_counts):
        parser.error(f"--schedulers {args.schedulers!r}: each count must be 1..{SHARDS}")
    if args.out is None:
        args.out = RESULTS.with_name("dispatch-cluster.json") if args.cluster else RESULTS
    return args


def child_main(argv: list[str]) -> int:
    """Hidden sub-commands run in child processes: `_schedule` and `_load`."""
    parser = argparse.ArgumentParser(prog="dispatch.py " + argv[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--max-seconds", type=float, default=300.0)
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--interval-ms", type=int, default=10)
    parser.add_argument("--ids", type=Path, default=Path("created.ids"))
    parser.add_argument("--client", choices=("raw", "engine"), default="raw")
    parser.add_argument("--node", default=None, help="_schedule: a fenced node with this id")
    parser.add_argument("--wait-go", action="store_true", help="_schedule: start on SIGUSR1")
    parser.add_argument("--cluster", action="store_true", help="_load: route per primary")
    args = parser.parse_args(argv[1:])
    if argv[0] == "_schedule":
        asyncio.run(scheduler_process(args.url, args.max_seconds, args.node, args.wait_go))
    else:
        asyncio.run(
            load_process(
                args.url,
                args.rate,
                args.seconds,
                args.interval_ms,
                args.ids,
                args.client,
                args.cluster,
            )
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("_schedule", "_load"):
        return child_main(argv)
    args = parse_args(argv)
    if args.cluster:
        from dispatch_cluster import cluster_main  # it imports this module

        return cluster_main(args)
    root = args.data_dir or Path(tempfile.mkdtemp(prefix="tw-bench-dispatch-"))
    parts = args.parts.split(",")
    print(
        f"dispatch bench: each part on a fresh redis-server, AOF appendfsync {args.appendfsync}; "
        f"{SHARDS} shards, {TENANTS} tenants, {PAYLOAD_BYTES} B payload",
        flush=True,
    )
    results: dict[str, Any] = {}
    started = time.perf_counter()
    try:
        if "throughput" in parts:
            results["throughput"] = run_part("throughput", root, args)
            print(throughput_line(results["throughput"]), flush=True)
        if "lag" in parts:
            results["lag"] = run_part("lag", root, args)
            print(lag_line(results["lag"], args), flush=True)
    finally:
        if args.data_dir is None:
            shutil.rmtree(root, ignore_errors=True)
    s = settings_for("redis://unused")
    out = {
        "parameters": {
            "runs": args.runs,
            "rate_per_s": args.rate,
            "seconds": args.seconds,
            "interval_ms": args.interval_ms,
            "delay_ms": 1000,
            "payload_bytes": PAYLOAD_BYTES,
            "shards": SHARDS,
            "tenants": TENANTS,
            "appendfsync": args.appendfsync,
            "tick_batch": s.tick_batch,
            "promote_batch": s.promote_batch,
            "poll_cap_ms": s.poll_cap_ms,
            "lag_client": args.client,
            "redis_version": next(iter(results.values()))["redis_version"] if results else None,
            "bench_seconds": round(time.perf_counter() - started, 1),
        },
        **results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
