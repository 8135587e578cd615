"""Full-size bench: N pending tasks on one redis-server, and what that server does at N.

One redis-server, started here with the shipped settings (timewheel.store.server's
RECOMMENDED_CONFIG, which deploy/redis.conf also holds: AOF, appendfsync always, RDB
preamble, listpack limits 1024/1024, noeviction; the AOF rewrite policy is Redis'
default, as deploy/redis.conf leaves it: auto-aof-rewrite-percentage 100, min-size 64mb).
Parts (--parts, in this order):

  load      N pending tasks (100-byte payloads, 1,000 tenants, 64 shards, due uniformly
            over the next 7 days) made by lua/task_create.lua with the calls
            Engine.create_many pipelines (bench/memory.py's loader). For the load only,
            CONFIG SET appendfsync everysec and auto-aof-rewrite-percentage 0 (no fork
            while loading); then the shipped settings again and a BGREWRITEAOF, so the
            measured state is what a deployed server holds (an RDB-preamble base file).
  memory    used_memory per task and in all (targets <= 200 B, <= 10 GiB at 50 M), and
            the key classes (bench/memory.py's MEMORY USAGE sampling).
  dispatch  1,000,000 runs created due now, promoted, then one Scheduler times their
            dispatch (bench/dispatch.py's throughput method).
  lag       a scheduler process and a load process creating at 10,000/s for 60 s, each
            run due 1 s after its create (bench/dispatch.py's lag method); the
            dataset's own runs falling due meanwhile are counted apart.
  create    single creates (Engine.tasks.create, redis-py) at a modest paced rate:
            latency p50/p99/max.
  rewrite   a BGREWRITEAOF on a quiet server (duration, INFO latest_fork_usec, copy-on-
            write), then the lag method again with a BGREWRITEAOF started during it.
  restart   kill -9 and start again on the same dir, timed until PING answers without
            LOADING: (a) just after a rewrite (base file only), (b) after K creates
            written to the incremental AOF; with the rewrite policy, a replay bound.
  takeover  (not run unless named) a replica of the server (the shipped settings, its
            own dir) full-syncs from it (timed until its link is up and its offset is
            the primary's); three sentinels monitor the primary; a `timewheel scheduler`
            process runs on the redis+sentinel:// URL and creates go through it at
            --takeover-rate/s, each due 1 s after its first try (a failed batch is sent
            again with the same idempotency keys); then kill -9 of the primary. Timed
            from the kill: until a sentinel names the replica (+switch-master), until
            creates are acknowledged again, until the first run due after the kill is
            dispatched on the new primary; the lag of the runs due in the 10 s after
            the kill (p50/p99/max); and every run acknowledged before (and after) the
            kill looked up in the new primary's ready streams (bench/takeover.py).
            Skipped, with the reason in the JSON, when MemAvailable is under 1.3x the
            server's used_memory (or the disk under 1.3x its AOF). The promoted replica
            is the bench's server for the parts after it (and a --keep-dir's).
  snapshot  take_snapshot into a PostgreSQL started here (bench/recovery.py's way).

Before the dispatch, lag and rewrite parts the runs the dataset has due by then are
dispatched by a scheduler and every ready stream is deleted (the records stay), so each
part measures its own runs. The parts that create (dispatch, lag, create, restart) add
their runs to the dataset: every part records dbsize and used_memory at its start.

--keep-dir D keeps the server's data (D/redis) and a state file (D/scale-state.json);
--reuse-dir D starts the server again on such a dir (that start is timed too) instead
of loading, so a long run can be done in parts. Every wait is bounded.

Run:  .venv/bin/python bench/scale.py                       (50 M tasks: ~45 min, estimated)
      .venv/bin/python bench/scale.py --tasks 300000 --out /tmp/s.json
      .venv/bin/python bench/scale.py --parts load,memory --keep-dir /var/tmp/tw-scale
      .venv/bin/python bench/scale.py --reuse-dir /var/tmp/tw-scale --parts dispatch,lag
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from common import percentile
from dispatch import (
    LAG_MAX_TARGET_MS,
    LAG_P99_TARGET_MS,
    MAIN_THREAD_CPU,
    count_stream_entries,
    host_gauge,
    info_section,
    lag_figures,
    latency_latest,
    read_dispatches,
    result_line,
    server_ms,
    spawn,
    stop_process,
    stream_keys,
    throughput,
    wait_for_line,
    wait_process,
)
from memory import (
    PAYLOAD_BYTES,
    SHARDS,
    SPREAD_DAYS,
    TENANTS,
    Workload,
    _create_raw,
    breakdown,
    memory_info,
    payload_json,
    tenant_names,
)
from rawpipe import RawPipe
from recovery import snapshot
from takeover import TakeoverPlan, run_takeover, takeover_line

from timewheel.archive.server import LocalPostgres
from timewheel.config import Settings
from timewheel.dispatch.scheduler import Scheduler
from timewheel.engine import Engine
from timewheel.store.server import RedisServer
from timewheel.tasks.model import NewTask

RESULTS = Path(__file__).resolve().parent / "results" / "scale.json"
PARTS = (
    "load",
    "memory",
    "dispatch",
    "lag",
    "create",
    "rewrite",
    "restart",
    "takeover",
    "snapshot",
)
DEFAULT_PARTS = tuple(p for p in PARTS if p not in ("takeover", "snapshot"))
STATE_FILE = "scale-state.json"
DAY_MS = 86_400_000
LOAD_BATCH = 2000
BYTES_PER_TASK_TARGET = 200
TOTAL_BYTES_TARGET = 10 * 2**30
# Headroom: ~205 B/task measured at 5 M (bench/results/memory-5m.json), times a margin
# for allocator slack and the copy-on-write of a rewrite forked under writes, plus 1 GiB
# for the bench's own processes.
EST_BYTES_PER_TASK = 205
MEMORY_MARGIN = 1.6
MEMORY_RESERVE = 2**30
# Disk: during the load the incremental AOF holds every create's effects (no rewrite):
# measured 414 B/task at 300,000 tasks, 470 at 20,000. Then the rewrite adds a base file
# (~0.6 of used_memory) before the incremental one is deleted.
EST_AOF_BYTES_PER_TASK = 450
DISK_MARGIN = 1.3
LOAD_CONFIG = {"appendfsync": "everysec", "auto-aof-rewrite-percentage": "0"}
SERVER_EXTRA = {"latency-monitor-threshold": "20"}
PROGRESS_EVERY_S = 30.0
CAUGHT_UP_RUNS = 1000
"""Runs sent in 2 s at most by a scheduler that has caught up with a dataset's due runs."""
MIN_LOAD_RATE = 3000
"""The load's deadline assumes at least this many creates/s (28,700/s measured at 5 M)."""
AOF_BYTES_PER_CREATE = 400
"""restart (c): incremental AOF per create of the dataset's shape (397 B measured at 50 M),
to size its steps; the loop reads the file's size after each."""
MAX_BOUND_CREATES = 5_000_000
"""restart (c): the most creates written to reach the policy's bound (a bounded loop)."""
REPLICA_MARGIN = 1.3
"""takeover: MemAvailable must be this many times the server's used_memory (a replica's
copy, plus the primary's copy-on-write while it forks the full sync's RDB), and the free
disk this many times its AOF."""


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def log(text: str) -> None:
    print(f"[{datetime.now(UTC).strftime('%H:%M:%S')}] {text}", flush=True)


# -- the host ----------------------------------------------------------------------------


def meminfo() -> dict[str, int]:
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("MemTotal", "MemAvailable"):
            out[name] = int(rest.split()[0]) * 1024
    return out


def host_info(root: Path) -> dict[str, Any]:
    mem = meminfo()
    return {
        "cpus": os.cpu_count(),
        "mem_total": mem.get("MemTotal"),
        "mem_available": mem.get("MemAvailable"),
        "disk_free": shutil.disk_usage(root).free,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def headroom(tasks: int, root: Path) -> dict[str, Any]:
    """Estimated memory and disk a load of `tasks` needs, against what is free."""
    mem_need = round(tasks * EST_BYTES_PER_TASK * MEMORY_MARGIN + MEMORY_RESERVE)
    disk_need = round(tasks * (EST_AOF_BYTES_PER_TASK + 0.6 * EST_BYTES_PER_TASK) * DISK_MARGIN)
    mem_free = meminfo().get("MemAvailable", 0)
    disk_free = shutil.disk_usage(root).free
    return {
        "memory_needed": mem_need,
        "memory_available": mem_free,
        "disk_needed": disk_need,
        "disk_free": disk_free,
        "ok": mem_need <= mem_free and disk_need <= disk_free,
    }


# -- the server --------------------------------------------------------------------------


@dataclass(slots=True)
class Bench:
    """The server under test and what the parts share."""

    root: Path
    args: argparse.Namespace
    server: RedisServer
    tasks: int
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.server.url

    def settings(self) -> Settings:
        return Settings(redis_url=self.url, shards=SHARDS)

    def client(self) -> aioredis.Redis:
        return aioredis.Redis.from_url(self.url, socket_timeout=60)

    def save_state(self) -> None:
        (self.root / STATE_FILE).write_text(json.dumps(self.state, indent=2) + "\n")


def make_server(data_dir: Path) -> RedisServer:
    return RedisServer(data_dir, port=0, appendfsync="always", extra_config=SERVER_EXTRA)


async def config_get(client: aioredis.Redis, *names: str) -> dict[str, str]:
    out = {}
    for name in names:
        got: Any = await client.config_get(name)
        out[name] = str(got.get(name, ""))
    return out


async def persistence(client: aioredis.Redis) -> dict[str, Any]:
    return await info_section(client, "persistence")


async def wait_rewrite_done(client: aioredis.Redis, timeout_s: float) -> float:
    """Wait until no AOF rewrite runs or is scheduled; returns the seconds waited."""
    started = time.perf_counter()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = await persistence(client)
        if not int(info.get("aof_rewrite_in_progress", 0)) and not int(
            info.get("aof_rewrite_scheduled", 0)
        ):
            return time.perf_counter() - started
        await asyncio.sleep(0.05)
    raise TimeoutError(f"AOF rewrite still running after {timeout_s:.0f} s")


async def rewrite(client: aioredis.Redis, timeout_s: float) -> dict[str, Any]:
    """BGREWRITEAOF and wait for it: duration, fork time, copy-on-write, AOF sizes."""
    await wait_rewrite_done(client, timeout_s)
    before = await persistence(client)
    started = time.perf_counter()
    await client.bgrewriteaof()
    await wait_rewrite_done(client, timeout_s)
    seconds = time.perf_counter() - started
    info = await persistence(client)
    stats = await info_section(client, "stats")
    if int(info.get("aof_rewrites", 0)) <= int(before.get("aof_rewrites", 0)):
        raise RuntimeError("BGREWRITEAOF did not complete")
    if info.get("aof_last_bgrewrite_status") != "ok":
        raise RuntimeError(f"BGREWRITEAOF failed: {info.get('aof_last_bgrewrite_status')}")
    return {
        "seconds": round(seconds, 2),
        "aof_last_rewrite_time_sec": int(info.get("aof_last_rewrite_time_sec", -1)),
        "latest_fork_usec": int(stats.get("latest_fork_usec", 0)),
        "aof_last_cow_size": int(info.get("aof_last_cow_size", 0)),
        "aof_base_size": int(info.get("aof_base_size", 0)),
        "aof_current_size": int(info.get("aof_current_size", 0)),
    }


async def aof_sizes(client: aioredis.Redis) -> dict[str, int]:
    info = await persistence(client)
    base, current = int(info.get("aof_base_size", 0)), int(info.get("aof_current_size", 0))
    return {"aof_base_size": base, "aof_current_size": current, "aof_incr_size": current - base}


def log_lines_since(server: RedisServer, offset: int) -> list[str]:
    with server.log_path.open("rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace").splitlines()


def timed_start(server: RedisServer, timeout_s: float) -> dict[str, Any]:
    """Start the server on its dir; the time until PING answers (not LOADING), and the
    load lines of its log."""
    offset = server.log_path.stat().st_size if server.log_path.exists() else 0
    started = time.perf_counter()
    server.start(timeout_s=timeout_s)
    seconds = time.perf_counter() - started
    loaded = [
        line.split(" * ", 1)[-1]
        for line in log_lines_since(server, offset)
        if "loaded from" in line or "Done loading" in line or "DB loaded" in line
    ]
    return {
        "seconds_to_ping": round(seconds, 2),
        "base_load_s": _logged_seconds(loaded, "from base file"),
        "incr_load_s": _logged_seconds(loaded, "from incr file"),
        "log": loaded[-6:],
    }


def _logged_seconds(lines: list[str], what: str) -> float | None:
    """The seconds of redis.log's 'DB loaded from base/incr file <name>: 1.23 seconds'."""
    total = None
    for line in lines:
        if what in line and line.endswith(" seconds"):
            with contextlib.suppress(ValueError):
                total = (total or 0.0) + float(line.rsplit(":", 1)[1].split()[0])
    return total


async def snapshot_of_server(bench: Bench) -> dict[str, Any]:
    client = bench.client()
    try:
        mem = await memory_info(client)
        return {"dbsize": int(await client.dbsize()), **mem}
    finally:
        await client.aclose()


async def delete_ready_streams(client: aioredis.Redis) -> int:
    """UNLINK every ready stream (the envelopes; records stay): each part counts its own."""
    keys = await stream_keys(client)
    for start in range(0, len(keys), 500):
        await client.unlink(*keys[start : start + 500])
    return len(keys)


async def promoted_to_now(engine: Engine) -> bool:
    """Whether every shard's promoter has reached the present: a scheduler that sends
    little while its promoter still cascades a backlog out of distant buckets (after a
    long pause between parts) has not caught up."""
    client = engine.client
    assert isinstance(client, aioredis.Redis)  # one redis-server
    now = await server_ms(client)
    pipe = client.pipeline(transaction=False)
    for shard in range(engine.settings.shards):
        pipe.hget(engine.keys.meta(shard), "promoted_until")
    reached = await pipe.execute()
    return all(int(v or 0) >= now for v in reached)


async def drain_due(bench: Bench, timeout_s: float) -> dict[str, Any]:
    """Dispatch what the dataset has due by now (one Scheduler until it has caught up:
    every shard promoted to the present and at most CAUGHT_UP_RUNS sent in the last 2 s,
    as the dataset's own runs keep falling due,
    about 83/s at 50 M over 7 days), then delete the ready streams, so the next part
    starts with none."""
    engine = await Engine.connect(bench.settings())
    try:
        await engine.store.scripts.library.load(engine.client)
        scheduler = Scheduler(engine.store)
        stop = asyncio.Event()
        task = asyncio.create_task(scheduler.run(stop))
        started = time.monotonic()
        window: collections.deque[int] = collections.deque(maxlen=8)  # 2 s of 0.25 s steps
        try:
            while time.monotonic() - started < timeout_s:
                await asyncio.sleep(0.25)
                if task.done():
                    task.result()
                    raise RuntimeError("the scheduler stopped early")
                window.append(scheduler.counters.dispatched)
                if (
                    len(window) == window.maxlen
                    and window[-1] - window[0] <= CAUGHT_UP_RUNS
                    and await promoted_to_now(engine)
                ):
                    break
        finally:
            stop.set()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(task, 10)
        client = bench.client()
        try:
            deleted = await delete_ready_streams(client)
        finally:
            await client.aclose()
        return {
            "dispatched": scheduler.counters.dispatched,
            "seconds": round(time.monotonic() - started, 1),
            "streams_deleted": deleted,
        }
    finally:
        await engine.close()


# -- load ----------------------------------------------------------------------------------


async def load(bench: Bench) -> dict[str, Any]:
    args = bench.args
    client = bench.client()
    engine = await Engine.connect(bench.settings())
    try:
        await engine.store.scripts.library.load(engine.client)  # the pipelines do not
        await client.config_resetstat()
        before = await memory_info(client)
        shipped = await config_get(client, *LOAD_CONFIG)
        for name, value in LOAD_CONFIG.items():
            await client.config_set(name, value)
        work = Workload(bench.tasks, tenant_names(TENANTS), int(time.time() * 1000), near=False)
        done = [0]

        def counted(batches: Iterator[list[bytes]]) -> Iterator[list[bytes]]:
            for commands in batches:
                yield commands
                done[0] = min(done[0] + args.batch, bench.tasks)

        async def progress() -> None:
            t0 = time.perf_counter()
            while True:
                await asyncio.sleep(PROGRESS_EVERY_S)
                elapsed = time.perf_counter() - t0
                rate = done[0] / elapsed
                used = (await memory_info(client))["used_memory"]
                eta = (bench.tasks - done[0]) / rate if rate else 0
                log(
                    f"load: {done[0]:,}/{bench.tasks:,} ({100 * done[0] / bench.tasks:.1f}%) "
                    f"{rate:,.0f}/s, used_memory {used / 2**30:.2f} GiB, "
                    f"{(used - before['used_memory']) / max(done[0], 1):.0f} B/task, "
                    f"eta {eta / 60:.1f} min"
                )

        reporter = asyncio.create_task(progress())
        started = time.perf_counter()
        pipe = await RawPipe.open(bench.url)
        try:
            timeout = bench.tasks / MIN_LOAD_RATE + 600
            await asyncio.wait_for(
                pipe.run(counted(_create_raw(engine, work, args.batch))), timeout
            )
        finally:
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporter
            await pipe.close()
        load_s = time.perf_counter() - started
        after_load = await memory_info(client)
        aof_after_load = await aof_sizes(client)
        stats = await info_section(client, "commandstats")
        for name, value in shipped.items():
            await client.config_set(name, value)
        log(f"load: {bench.tasks:,} in {load_s:.0f} s; BGREWRITEAOF (the deployed state)")
        rewritten = await rewrite(client, args.rewrite_timeout)
        fcall = stats.get("cmdstat_fcall") or {}
        return {
            "tasks": bench.tasks,
            "seconds": round(load_s, 1),
            "per_s": round(bench.tasks / load_s),
            "batch": args.batch,
            "load_config": LOAD_CONFIG,
            "config_after": shipped,
            "fcall_usec_per_call": fcall.get("usec_per_call"),
            "before": before,
            "after_load": after_load,
            "aof_after_load": aof_after_load,
            "aof_bytes_per_task_during_load": round(
                aof_after_load["aof_current_size"] / bench.tasks
            ),
            "rewrite_after_load": rewritten,
            "now_ms": work.now_ms,
        }
    finally:
        await engine.close()
        await client.aclose()


def load_line(r: dict[str, Any]) -> str:
    w = r["rewrite_after_load"]
    return (
        f"SUMMARY scale load: {r['tasks']:,} pending tasks in {r['seconds']:,.0f} s = "
        f"{r['per_s']:,}/s (appendfsync everysec, no auto rewrite); AOF "
        f"{r['aof_after_load']['aof_current_size'] / 2**30:.2f} GiB after the load "
        f"({r['aof_bytes_per_task_during_load']} B/task), BGREWRITEAOF {w['seconds']:.1f} s "
        f"-> base {w['aof_base_size'] / 2**30:.2f} GiB"
    )


# -- memory --------------------------------------------------------------------------------


async def memory(bench: Bench) -> dict[str, Any]:
    client = bench.client()
    try:
        info = await info_section(client, "memory")
        before = bench.state["load"]["before"]
        used = int(info["used_memory"])
        dataset = int(info["used_memory_dataset"])
        events = 0
        parts = await breakdown(client, bench.args.sample, bench.tasks)
        events = int(parts.get("events", {}).get("bytes", 0))
        delta = used - int(before["used_memory"])
        added = int(bench.state.get("runs_added", 0))
        return {
            "tasks": bench.tasks,
            "dbsize": int(await client.dbsize()),
            "used_memory": used,
            "used_memory_rss": int(info["used_memory_rss"]),
            "used_memory_peak": int(info["used_memory_peak"]),
            "mem_fragmentation_ratio": float(info["mem_fragmentation_ratio"]),
            "used_memory_dataset": dataset,
            "used_memory_before_load": int(before["used_memory"]),
            "bytes_per_task": round(delta / bench.tasks, 1),
            "bytes_per_task_excl_event_log": round((delta - events) / bench.tasks, 1),
            "event_log_bytes": events,
            "target_bytes_per_task": BYTES_PER_TASK_TARGET,
            "target_total_bytes": TOTAL_BYTES_TARGET,
            # Judged only on the loaded dataset alone (other parts' runs would count).
            "met": (delta / bench.tasks <= BYTES_PER_TASK_TARGET and used <= TOTAL_BYTES_TARGET)
            if not added
            else None,
            "runs_added_since_load": added,
            "bytes_per_run_incl_added": round(delta / (bench.tasks + added), 1),
            "breakdown": parts,
        }
    finally:
        await client.aclose()


def memory_line(r: dict[str, Any]) -> str:
    top = sorted(r["breakdown"].items(), key=lambda kv: -int(kv[1]["bytes"]))[:4]
    classes = ", ".join(f"{k} {v['bytes_per_task']:.0f}" for k, v in top)
    added = ""
    verdict = {True: "met", False: "MISSED", None: "not judged"}[r["met"]]
    if r["runs_added_since_load"]:
        added = (
            f" (the dataset also holds {r['runs_added_since_load']:,} runs earlier parts "
            f"made: {r['bytes_per_run_incl_added']:.1f} B a run over all; read the load's "
            "run for the per-task figure)"
        )
    return (
        f"SUMMARY scale memory: {r['bytes_per_task']:.1f} B/task "
        f"({r['bytes_per_task_excl_event_log']:.1f} excl. the event log), used_memory "
        f"{r['used_memory'] / 2**30:.2f} GiB for {r['tasks']:,} tasks (targets <= "
        f"{BYTES_PER_TASK_TARGET} B/task, <= 10 GiB: {verdict}); "
        f"B/task by class: {classes}{added}"
    )


# -- dispatch --------------------------------------------------------------------------------


async def dispatch(bench: Bench) -> dict[str, Any]:
    args = bench.args
    drained = await drain_due(bench, args.part_timeout)
    result = await throughput(bench.url, args.runs, args.batch, args.part_timeout)
    client = bench.client()
    try:
        await delete_ready_streams(client)
    finally:
        await client.aclose()
    result["drained_before"] = drained
    return result


def dispatch_line(r: dict[str, Any]) -> str:
    return (
        f"SUMMARY scale dispatch: {r['dispatched']:,} of {r['runs']:,} due runs in "
        f"{r['seconds']:.2f} s = {r['per_s']:,}/s by one scheduler with the dataset in place "
        f"(target >= 75,000/s: {'met' if r['met'] else 'MISSED'}); promote "
        f"{r['promote_seconds']:.2f} s; Lua {r['lua_us_per_run']} us/run"
    )


# -- lag (and lag under a rewrite) ----------------------------------------------------------


async def lag_run(
    bench: Bench,
    rate: int,
    seconds: float,
    work_dir: Path,
    during: Callable[[aioredis.Redis], Coroutine[Any, Any, dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """bench/dispatch.py's lag method on the loaded server: a scheduler process, then a
    load process at `rate`/s for `seconds`, each run due 1 s after its create. The
    dataset's runs falling due meanwhile are dispatched too; they are counted apart.
    `during(client)` runs alongside the load (started with it) and its result is kept."""
    work_dir.mkdir(parents=True, exist_ok=True)
    drained = await drain_due(bench, bench.args.part_timeout)
    sched_log, load_log = work_dir / "scheduler.log", work_dir / "load.log"
    ids_path = work_dir / "created.ids"
    sched = spawn(["_schedule", "--url", bench.url, "--max-seconds", str(seconds + 300)], sched_log)
    load_proc: subprocess.Popen[bytes] | None = None
    client = bench.client()
    side: asyncio.Task[dict[str, Any]] | None = None
    try:
        await wait_for_line(sched_log, "READY", sched, 60)
        await asyncio.sleep(1.0)  # its first pass (promote every shard) is done
        await client.config_resetstat()
        await client.execute_command("LATENCY", "RESET")  # type: ignore[no-untyped-call]
        cpu0 = await info_section(client, "cpu")
        command = ["_load", "--url", bench.url, "--rate", str(rate), "--seconds", str(seconds)]
        command += ["--interval-ms", "10", "--ids", str(ids_path), "--client", "raw"]
        load_proc = spawn(command, load_log)
        if during is not None:
            side = asyncio.create_task(during(client))
        code = await wait_process(load_proc, seconds + 120)
        load_result = result_line(load_log)
        if code != 0 or load_result is None:
            raise RuntimeError(f"load process failed ({code}): {load_log.read_text()[-2000:]}")
        created = ids_path.read_text().split()
        ended = time.monotonic()
        count = await count_stream_entries(client)
        while time.monotonic() - ended < 60 and (
            count < len(created) or time.monotonic() - ended < 2
        ):
            await asyncio.sleep(0.25)
            count = await count_stream_entries(client)
        await asyncio.sleep(0.5)  # a run dispatched twice would show by now
        side_result = await asyncio.wait_for(side, bench.args.rewrite_timeout) if side else None
        stop_process(sched)
        cpu1 = await info_section(client, "cpu")
        dispatches = await read_dispatches(client)
        mine = set(created)
        own = [d for d in dispatches if d[0] in mine]
        figures = lag_figures(created, own)
        background = [d[2] - d[1] for d in dispatches if d[0] not in mine]
        background.sort()
        figures.update(
            {
                "rate": rate,
                "seconds": seconds,
                "load": load_result,
                "scheduler": result_line(sched_log),
                "dataset_runs_dispatched": len(background),
                "dataset_runs_lag_p99_ms": percentile(background, 99),
                "drained_before": drained,
                "redis_main_thread_cpu_s": round(
                    sum(float(cpu1[k]) - float(cpu0[k]) for k in MAIN_THREAD_CPU), 2
                ),
                "latency_latest": await latency_latest(client),
                "met": (
                    figures["p99_ms"] <= LAG_P99_TARGET_MS
                    and (figures["max_ms"] or 0) <= LAG_MAX_TARGET_MS
                    and figures["duplicates"] == 0
                    and figures["missing"] == 0
                ),
            }
        )
        if side_result is not None:
            figures["during"] = side_result
        await delete_ready_streams(client)
        return figures
    finally:
        if side is not None and not side.done():
            side.cancel()
        if load_proc is not None:
            stop_process(load_proc)
        stop_process(sched)
        await client.aclose()


def lag_line(r: dict[str, Any], what: str) -> str:
    load = r["load"]
    return (
        f"SUMMARY scale {what}: offered {r['rate']:,}/s for {r['seconds']:g} s (achieved "
        f"{load['achieved_per_s']:,}/s, {load['created']:,} created): lag p50 {r['p50_ms']} ms, "
        f"p99 {r['p99_ms']} ms, max {r['max_ms']} ms; duplicates {r['duplicates']}, missing "
        f"{r['missing']} (targets p99 <= {LAG_P99_TARGET_MS} ms, max <= {LAG_MAX_TARGET_MS} "
        f"ms: {'met' if r['met'] else 'MISSED'}); {r['dataset_runs_dispatched']:,} of the "
        f"dataset's runs fell due meanwhile"
    )


async def lag(bench: Bench) -> dict[str, Any]:
    args = bench.args
    return await lag_run(bench, args.rate, args.lag_seconds, bench.root / "work-lag")


# -- create --------------------------------------------------------------------------------


async def create(bench: Bench) -> dict[str, Any]:
    """Single creates, one at a time on one connection, paced at --create-rate."""
    args = bench.args
    engine = await Engine.connect(bench.settings())
    tenants = tenant_names(TENANTS)
    latencies: list[float] = []
    try:
        await engine.store.scripts.library.load(engine.client)
        count = round(args.create_rate * args.create_seconds)
        interval = 1 / args.create_rate
        now_ms = int(time.time() * 1000)
        t0 = time.perf_counter()
        for i in range(count):
            wait = t0 + i * interval - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            new = NewTask(
                tenant=tenants[i % TENANTS],
                payload_json=payload_json(i),
                run_at_ms=now_ms + 60_000 + (i * 7_919_111) % (SPREAD_DAYS * DAY_MS),
            )
            sent = time.perf_counter()
            result = await engine.tasks.create(new)
            latencies.append((time.perf_counter() - sent) * 1000)
            if not result.created:
                raise RuntimeError("a create was not a new task")
        elapsed = time.perf_counter() - t0
    finally:
        await engine.close()
    latencies.sort()
    return {
        "creates": len(latencies),
        "rate": args.create_rate,
        "achieved_per_s": round(len(latencies) / elapsed),
        "client": "Engine.tasks.create (redis-py), one at a time, appendfsync always",
        "p50_ms": round(percentile(latencies, 50), 3),
        "p90_ms": round(percentile(latencies, 90), 3),
        "p99_ms": round(percentile(latencies, 99), 3),
        "max_ms": round(latencies[-1], 3) if latencies else None,
    }


def create_line(r: dict[str, Any]) -> str:
    return (
        f"SUMMARY scale create: {r['creates']:,} single creates at {r['achieved_per_s']:,}/s: "
        f"p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, max {r['max_ms']:.2f} ms"
    )


# -- rewrite ----------------------------------------------------------------------------------


async def rewrite_part(bench: Bench) -> dict[str, Any]:
    args = bench.args
    client = bench.client()
    try:
        quiet = await rewrite(client, args.rewrite_timeout)
    finally:
        await client.aclose()
    log(f"rewrite: quiet BGREWRITEAOF {quiet['seconds']:.1f} s; now one under the lag load")

    async def during(c: aioredis.Redis) -> dict[str, Any]:
        await asyncio.sleep(args.rewrite_after)
        out = await rewrite(c, args.rewrite_timeout)
        out["started_after_s"] = args.rewrite_after
        out["ended_within_load"] = args.rewrite_after + out["seconds"] <= args.rewrite_lag_seconds
        return out

    under = await lag_run(
        bench, args.rate, args.rewrite_lag_seconds, bench.root / "work-rewrite", during
    )
    return {"quiet": quiet, "lag_during_rewrite": under}


def rewrite_line(r: dict[str, Any]) -> str:
    q, lag_r = r["quiet"], r["lag_during_rewrite"]
    d = lag_r["during"]
    return (
        f"SUMMARY scale rewrite: BGREWRITEAOF {q['seconds']:.1f} s quiet (fork "
        f"{q['latest_fork_usec'] / 1000:.0f} ms, base {q['aof_base_size'] / 2**30:.2f} GiB), "
        f"{d['seconds']:.1f} s under {lag_r['rate']:,}/s (fork {d['latest_fork_usec'] / 1000:.0f} "
        f"ms, copy-on-write {d['aof_last_cow_size'] / 2**20:.0f} MiB); dispatch lag meanwhile "
        f"p50 {lag_r['p50_ms']} ms, p99 {lag_r['p99_ms']} ms, max {lag_r['max_ms']} ms"
    )


# -- restart --------------------------------------------------------------------------------


async def write_creates(bench: Bench, count: int) -> float:
    """`count` creates (the dataset's shape) through the raw pipelined loader; seconds."""
    engine = await Engine.connect(bench.settings())
    try:
        await engine.store.scripts.library.load(engine.client)
        work = Workload(count, tenant_names(TENANTS), int(time.time() * 1000), near=False, seed=2)
        pipe = await RawPipe.open(bench.url)
        started = time.perf_counter()
        try:
            await asyncio.wait_for(
                pipe.run(_create_raw(engine, work, LOAD_BATCH)), count / MIN_LOAD_RATE + 300
            )
        finally:
            await pipe.close()
        return time.perf_counter() - started
    finally:
        await engine.close()


def kill_and_start(bench: Bench) -> dict[str, Any]:
    bench.server.kill()
    return timed_start(bench.server, bench.args.start_timeout)


async def restart(bench: Bench) -> dict[str, Any]:
    args = bench.args
    client = bench.client()
    try:
        policy = await config_get(
            client, "appendfsync", "auto-aof-rewrite-percentage", "auto-aof-rewrite-min-size"
        )
        rewritten = await rewrite(client, args.rewrite_timeout)
        sizes_a = await aof_sizes(client)
    finally:
        await client.aclose()
    log("restart: (a) kill -9 just after a rewrite")
    a = {**kill_and_start(bench), **sizes_a, "rewrite": rewritten}
    count = args.incr_creates
    log(f"restart: (b) {count:,} creates into the incremental AOF, then kill -9")
    write_s = await write_creates(bench, count)
    client = bench.client()
    try:
        sizes_b = await aof_sizes(client)
    finally:
        await client.aclose()
    b = {**kill_and_start(bench), **sizes_b, "creates": count, "write_seconds": round(write_s, 1)}
    # The incremental file's replay time as Redis logs it, else the difference of the
    # two starts.
    incr_s = b["incr_load_s"] or b["seconds_to_ping"] - a["seconds_to_ping"]
    b["incr_replay_bytes_per_s"] = round(sizes_b["aof_incr_size"] / max(incr_s, 0.01))
    # The deployed policy rewrites once the AOF has grown by `pct` % of its size after
    # the last rewrite (and is at least min-size): the incremental part is then at most
    # about max(base * pct / 100, min-size - base) before a rewrite starts.
    pct = int(policy["auto-aof-rewrite-percentage"])
    min_size = int(policy["auto-aof-rewrite-min-size"])
    base = sizes_b["aof_base_size"]
    max_incr = max(base * pct // 100, min_size - base) if pct else None
    bound = (
        round(a["seconds_to_ping"] + max_incr / max(b["incr_replay_bytes_per_s"], 1), 1)
        if max_incr is not None
        else None
    )
    worst = await restart_at_the_bound(bench, max_incr) if max_incr is not None else None
    return {
        "policy": policy,
        "after_rewrite": a,
        "with_incremental": b,
        "max_incr_before_auto_rewrite": max_incr,
        "replay_bound_s_estimate": bound,
        "at_the_bound": worst,
    }


async def restart_at_the_bound(bench: Bench, max_incr: int) -> dict[str, Any]:
    """The crash the rewrite policy allows at its worst: creates written with automatic
    rewrites held off until the incremental AOF is as large as the policy lets it grow
    (just before it would start a rewrite), then kill -9 and the time to PING. The
    restart reads redis.conf again, so the policy is back after it."""
    client = bench.client()
    try:
        await rewrite(client, bench.args.rewrite_timeout)
        await client.config_set("auto-aof-rewrite-percentage", 0)
        step = max(10_000, round(max_incr / AOF_BYTES_PER_CREATE / 4))
        written, seconds = 0, 0.0
        sizes = await aof_sizes(client)
        first = sizes["aof_incr_size"]
        per_create = float(AOF_BYTES_PER_CREATE)
        while sizes["aof_incr_size"] < max_incr and written < MAX_BOUND_CREATES:
            # the last steps only what the bound still lacks (at least 1,000), at the
            # bytes per create seen so far
            lacking = (max_incr - sizes["aof_incr_size"]) / per_create
            count = min(step, max(1_000, round(lacking)))
            seconds += await write_creates(bench, count)
            written += count
            sizes = await aof_sizes(client)
            per_create = max(1.0, (sizes["aof_incr_size"] - first) / written)
    finally:
        await client.aclose()
    log(
        f"restart: (c) {written:,} creates, incremental AOF {sizes['aof_incr_size'] / 2**20:.0f}"
        f" MiB (the policy's bound {max_incr / 2**20:.0f} MiB), then kill -9"
    )
    return {
        **kill_and_start(bench),
        **sizes,
        "creates": written,
        "write_seconds": round(seconds, 1),
        "bound_bytes": max_incr,
    }


def restart_line(r: dict[str, Any]) -> str:
    a, b, c = r["after_rewrite"], r["with_incremental"], r.get("at_the_bound")
    p = r["policy"]
    worst = (
        f"; at the policy's bound ({c['aof_incr_size'] / 2**20:.0f} MiB incremental, "
        f"{c['creates']:,} creates): {c['seconds_to_ping']:.1f} s (measured)"
        if c
        else ""
    )
    return (
        f"SUMMARY scale restart: kill -9 to PING {a['seconds_to_ping']:.1f} s from the base "
        f"file ({a['aof_base_size'] / 2**30:.2f} GiB), {b['seconds_to_ping']:.1f} s with "
        f"{b['aof_incr_size'] / 2**20:.0f} MiB incremental ({b['creates']:,} creates); rewrite "
        f"policy {p['auto-aof-rewrite-percentage']}% / min "
        f"{int(p['auto-aof-rewrite-min-size']) / 2**20:.0f} MiB "
        f"-> incremental at most ~{(r['max_incr_before_auto_rewrite'] or 0) / 2**30:.2f} GiB, "
        f"restart bound ~{r['replay_bound_s_estimate']} s (estimate){worst}"
    )


# -- takeover --------------------------------------------------------------------------------


def replica_refusal(
    used_memory: int, aof_bytes: int, root: Path, margin: float = REPLICA_MARGIN
) -> dict[str, Any] | None:
    """Why a replica of a server of `used_memory` bytes is not started here, or None."""
    available = meminfo().get("MemAvailable", 0)
    disk_free = shutil.disk_usage(root).free
    need_mem = round(used_memory * margin)
    need_disk = round(aof_bytes * margin)
    if available >= need_mem and disk_free >= need_disk:
        return None
    return {
        "skipped": True,
        "reason": (
            f"a replica needs ~{need_mem / 2**30:.2f} GiB RAM ({available / 2**30:.2f} "
            f"available) and ~{need_disk / 2**30:.2f} GiB disk ({disk_free / 2**30:.2f} free)"
        ),
        "memory_needed": need_mem,
        "memory_available": available,
        "disk_needed": need_disk,
        "disk_free": disk_free,
    }


async def takeover_part(bench: Bench) -> dict[str, Any]:
    args = bench.args
    client = bench.client()
    try:
        used = (await memory_info(client))["used_memory"]
        aof = (await aof_sizes(client))["aof_current_size"]
    finally:
        await client.aclose()
    refused = replica_refusal(used, aof, bench.root, bench.args.replica_margin)
    if refused is not None:
        log(f"takeover: skipped: {refused['reason']}")
        return refused
    drained = await drain_due(bench, args.part_timeout)
    primary = bench.server
    name = "redis-replica" if primary.data_dir.name != "redis-replica" else "redis"
    shutil.rmtree(bench.root / name, ignore_errors=True)  # a former primary's stale copy
    replica = RedisServer(
        bench.root / name,
        port=0,
        appendfsync="always",
        extra_config={**SERVER_EXTRA, "replicaof": f"{primary.host} {primary.port}"},
    )
    plan = TakeoverPlan(
        rate=args.takeover_rate,
        before_s=args.takeover_before_s,
        after_s=args.takeover_after_s,
        down_after_ms=args.down_after_ms,
        failover_timeout_ms=args.failover_timeout_ms,
        sync_timeout_s=args.start_timeout + args.rewrite_timeout,
        settle_timeout_s=min(600.0, args.part_timeout),
    )
    log(f"takeover: a replica in {replica.data_dir} full-syncs, then kill -9 of the primary")
    try:
        figures = await run_takeover(primary, replica, bench.root, plan)
    finally:
        if primary.is_running():  # failed before the kill: the primary stays the server
            replica.stop()
        else:  # the promoted replica holds the dataset now
            replica.extra_config.pop("replicaof", None)
            bench.server = replica
            bench.state["server_dir"] = name
    figures["drained_before"] = drained
    return figures


# -- snapshot --------------------------------------------------------------------------------


async def snapshot_part(bench: Bench) -> dict[str, Any]:
    pg_root = bench.root / "postgres"
    postgres = LocalPostgres(pg_root)
    os.chmod(bench.root, 0o755)  # the postgres OS user must reach it when run as root
    postgres.start()
    try:
        settings = Settings(redis_url=bench.url, shards=SHARDS, postgres_dsn=postgres.dsn())
        result = await asyncio.wait_for(snapshot(settings), bench.args.part_timeout)
    finally:
        postgres.stop()
        shutil.rmtree(pg_root, ignore_errors=True)
    return result


def snapshot_line(r: dict[str, Any]) -> str:
    return (
        f"SUMMARY scale snapshot: {r['rows']:,} rows into PostgreSQL in {r['snapshot_s']:.1f} s "
        f"({r['rows_per_s']:,} rows/s)"
    )


# -- main ------------------------------------------------------------------------------------


PART_RUN: dict[str, Callable[[Bench], Coroutine[Any, Any, dict[str, Any]]]] = {
    "load": load,
    "memory": memory,
    "dispatch": dispatch,
    "lag": lag,
    "create": create,
    "rewrite": rewrite_part,
    "restart": restart,
    "takeover": takeover_part,
    "snapshot": snapshot_part,
}
PART_LINE: dict[str, Callable[[dict[str, Any]], str]] = {
    "load": load_line,
    "memory": memory_line,
    "dispatch": dispatch_line,
    "lag": lambda r: lag_line(r, "lag"),
    "create": create_line,
    "rewrite": rewrite_line,
    "restart": restart_line,
    "takeover": takeover_line,
    "snapshot": snapshot_line,
}


def runs_added(name: str, r: dict[str, Any]) -> int:
    """Runs a part added to the dataset (their records stay)."""
    if name == "dispatch":
        return int(r["runs"])
    if name == "lag":
        return int(r["created"])
    if name == "rewrite":
        return int(r["lag_during_rewrite"]["created"])
    if name == "create":
        return int(r["creates"])
    if name == "restart":
        return int(r["with_incremental"]["creates"])
    if name == "takeover" and not r.get("skipped"):
        return int(r["acked_before_kill"]) + int(r["acked_after_kill"])
    return 0


def part_parameters(name: str, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "load": {"batch": args.batch, "load_config": LOAD_CONFIG},
        "memory": {"sample_keys_per_class": args.sample},
        "dispatch": {"runs": args.runs, "batch": args.batch},
        "lag": {"rate": args.rate, "seconds": args.lag_seconds, "delay_ms": 1000},
        "create": {"rate": args.create_rate, "seconds": args.create_seconds},
        "rewrite": {
            "rate": args.rate,
            "seconds": args.rewrite_lag_seconds,
            "rewrite_after_s": args.rewrite_after,
        },
        "restart": {"incr_creates": args.incr_creates, "start_timeout_s": args.start_timeout},
        "takeover": {
            "rate": args.takeover_rate,
            "before_s": args.takeover_before_s,
            "after_s": args.takeover_after_s,
            "delay_ms": 1000,
            "sentinels": 3,
            "down_after_ms": args.down_after_ms,
            "failover_timeout_ms": args.failover_timeout_ms,
        },
        "snapshot": {},
    }[name]


def parse_parts(text: str, parser: argparse.ArgumentParser) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [n for n in names if n not in PARTS]
    if unknown or not names:
        parser.error(
            f"--parts: unknown {', '.join(unknown) or '(none)'}; known: {', '.join(PARTS)}"
        )
    return [p for p in PARTS if p in names]  # always in the documented order


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=50_000_000, help="pending tasks to load")
    parser.add_argument(
        "--parts", default=",".join(DEFAULT_PARTS), help=f"comma list of {', '.join(PARTS)}"
    )
    parser.add_argument("--keep-dir", type=Path, help="keep the server's data here")
    parser.add_argument("--reuse-dir", type=Path, help="start on a --keep-dir instead of loading")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    parser.add_argument("--batch", type=int, default=LOAD_BATCH, help="tasks per load pipeline")
    parser.add_argument("--sample", type=int, default=3000, help="keys sampled per key class")
    parser.add_argument("--runs", type=int, default=1_000_000, help="due runs (dispatch)")
    parser.add_argument("--rate", type=int, default=10_000, help="creates/s (lag, rewrite)")
    parser.add_argument("--lag-seconds", type=float, default=60.0, help="lag load length")
    parser.add_argument("--create-rate", type=float, default=200.0, help="single creates/s")
    parser.add_argument("--create-seconds", type=float, default=20.0, help="create part length")
    parser.add_argument(
        "--rewrite-lag-seconds", type=float, default=120.0, help="lag load under a rewrite"
    )
    parser.add_argument(
        "--rewrite-after", type=float, default=10.0, help="s into that load the rewrite starts"
    )
    parser.add_argument(
        "--incr-creates",
        type=int,
        default=None,
        help="creates written to the incremental AOF before restart (b) (default 1,000,000, "
        "at most a third of --tasks)",
    )
    parser.add_argument(
        "--start-timeout", type=float, default=None, help="s a start may take (AOF load)"
    )
    parser.add_argument(
        "--rewrite-timeout", type=float, default=None, help="s a BGREWRITEAOF may take"
    )
    parser.add_argument("--part-timeout", type=float, default=1800.0, help="s per part, at most")
    parser.add_argument(
        "--takeover-rate", type=int, default=300, help="creates/s through Sentinel (takeover)"
    )
    parser.add_argument(
        "--takeover-before-s", type=float, default=10.0, help="s of creates before the kill"
    )
    parser.add_argument(
        "--takeover-after-s", type=float, default=20.0, help="s of creates after the kill"
    )
    parser.add_argument(
        "--down-after-ms", type=int, default=1000, help="sentinel down-after-milliseconds"
    )
    parser.add_argument(
        "--failover-timeout-ms", type=int, default=5000, help="sentinel failover-timeout"
    )
    parser.add_argument(
        "--replica-margin",
        type=float,
        default=REPLICA_MARGIN,
        help="free memory (and disk) a replica needs, times the primary's used_memory (AOF)",
    )
    args = parser.parse_args(argv)
    args.parts = parse_parts(args.parts, parser)
    if args.tasks < 1000:
        parser.error("--tasks must be at least 1000")
    for name in ("runs", "rate", "batch", "sample", "takeover_rate", "down_after_ms"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if args.create_rate <= 0 or args.create_seconds <= 0 or args.lag_seconds <= 0:
        parser.error("--create-rate, --create-seconds and --lag-seconds must be positive")
    if args.keep_dir and args.reuse_dir:
        parser.error("give --keep-dir or --reuse-dir, not both (a reused dir is kept)")
    if args.reuse_dir and "load" in args.parts:
        parser.error("--reuse-dir starts on a loaded dataset: leave 'load' out of --parts")
    if not args.reuse_dir and "load" not in args.parts:
        parser.error("without --reuse-dir the dataset is loaded: put 'load' in --parts")
    if args.reuse_dir and not (args.reuse_dir / STATE_FILE).is_file():
        parser.error(f"--reuse-dir {args.reuse_dir}: no {STATE_FILE} (not a --keep-dir)")
    return args


def fill_defaults(args: argparse.Namespace, tasks: int) -> None:
    if args.incr_creates is None:
        args.incr_creates = min(1_000_000, max(1000, tasks // 3))
    if args.start_timeout is None:
        args.start_timeout = 120 + tasks / 50_000  # ~1,100 s at 50 M
    if args.rewrite_timeout is None:
        args.rewrite_timeout = 120 + tasks / 50_000


def merge_out(path: Path, run: dict[str, Any], reuse: bool) -> dict[str, Any]:
    """A run's results; a --reuse-dir run adds its parts to an existing file of the
    same dataset (each part keeps its own parameters and timestamps)."""
    if reuse and path.is_file():
        old: dict[str, Any] = json.loads(path.read_text())
        if old.get("dataset", {}).get("id") == run["dataset"]["id"]:
            # A part measured again is kept beside the earlier one, as <part>#<run>.
            index = len(old["runs"]) + 1
            for name, figures in run["parts"].items():
                key = name if name not in old["parts"] else f"{name}#{index}"
                old["parts"][key] = figures
                old["summaries"][key] = run["summaries"][name]
            old["runs"].append(run["runs"][0])
            return old
    return run


def refuse(tasks: int, root: Path) -> str | None:
    """Why a load of `tasks` into `root` is refused (too little memory or disk), or None."""
    room = headroom(tasks, root)
    if room["ok"]:
        return None
    return (
        f"scale: refusing {tasks:,} tasks: needs ~{room['memory_needed'] / 2**30:.1f} GiB "
        f"RAM ({room['memory_available'] / 2**30:.1f} available) and "
        f"~{room['disk_needed'] / 2**30:.1f} GiB disk ({room['disk_free'] / 2**30:.1f} "
        f"free in {root})"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    reuse = args.reuse_dir is not None
    if args.reuse_dir or args.keep_dir:
        root = args.reuse_dir or args.keep_dir
        root.mkdir(parents=True, exist_ok=True)
    else:
        root = Path(tempfile.mkdtemp(prefix="tw-bench-scale-"))
        refused = refuse(args.tasks, root)
        if refused:
            shutil.rmtree(root, ignore_errors=True)
            print(refused, file=sys.stderr)
            return 2
    state: dict[str, Any] = {}
    if reuse:
        state = json.loads((root / STATE_FILE).read_text())
        tasks = int(state["tasks"])
        if tasks != args.tasks and "--tasks" in " ".join(argv):
            print(f"scale: {root} holds {tasks:,} tasks; --tasks is ignored", file=sys.stderr)
    else:
        tasks = args.tasks
        if (root / "redis").exists():
            print(
                f"scale: {root / 'redis'} exists; use --reuse-dir or an empty dir", file=sys.stderr
            )
            return 2
        room = headroom(tasks, root)
        if not room["ok"]:
            print(refuse(tasks, root), file=sys.stderr)
            return 2
        state = {"tasks": tasks, "id": f"{tasks}-{int(time.time())}", "headroom": room}
    fill_defaults(args, tasks)
    server = make_server(root / state.get("server_dir", "redis"))  # takeover moves it
    bench = Bench(root=root, args=args, server=server, tasks=tasks, state=state)
    run_record = {
        "started": now_iso(),
        "argv": argv,
        "parts": args.parts,
        "host": host_info(root),
    }
    results: dict[str, Any] = {}
    summaries: dict[str, str] = {}
    log(
        f"scale bench: {tasks:,} tasks, parts {','.join(args.parts)}, data in {root}"
        + (" (reused)" if reuse else "")
    )
    try:
        if reuse:
            started = timed_start(bench.server, args.start_timeout)
            run_record["start_on_reused_dir"] = started
            log(f"started on {root / 'redis'} in {started['seconds_to_ping']:.1f} s")
        else:
            bench.server.start()
        for name in args.parts:
            t0 = time.perf_counter()
            entry: dict[str, Any] = {
                "started": now_iso(),
                "parameters": part_parameters(name, args),
                "host_loadavg": [round(x, 2) for x in os.getloadavg()],
                "server_before": asyncio.run(snapshot_of_server(bench)),
                # ns per Lua redis.call now: how fast this shared host runs Redis's Lua
                "host_gauge": asyncio.run(host_gauge(bench.url)),
            }
            log(f"{name}: starting")
            figures: dict[str, Any] = asyncio.run(PART_RUN[name](bench))
            entry.update(figures)
            entry["ended"] = now_iso()
            entry["part_seconds"] = round(time.perf_counter() - t0, 1)
            results[name] = entry
            if name == "load":
                state["load"] = figures
                state["loaded"] = entry["ended"]
            state["runs_added"] = state.get("runs_added", 0) + runs_added(name, figures)
            summaries[name] = PART_LINE[name](entry)
            print(summaries[name], flush=True)
        if args.keep_dir or reuse:
            bench.save_state()
    finally:
        bench.server.stop(timeout_s=args.start_timeout)
        if not (args.keep_dir or reuse):
            shutil.rmtree(root, ignore_errors=True)
    version = "?"
    with contextlib.suppress(Exception):
        version = subprocess.run(
            ["redis-server", "--version"], capture_output=True, text=True, check=False
        ).stdout.split()[2]
    run_record["ended"] = now_iso()
    out = merge_out(
        args.out,
        {
            "dataset": {
                "id": state["id"],
                "tasks": tasks,
                "payload_bytes": PAYLOAD_BYTES,
                "shards": SHARDS,
                "tenants": TENANTS,
                "spread_days": SPREAD_DAYS,
                "loaded": state.get("loaded"),
                "redis": version,
                "server_config": {
                    k: v
                    for k, v in bench.server.config().items()
                    if k not in ("port", "bind", "dir", "logfile", "pidfile")
                },
                "rewrite_policy": "as deploy/redis.conf sets it (server_config)",
            },
            "runs": [run_record],
            "parts": results,
            "summaries": summaries,
        },
        reuse,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
