"""A full audit pass over N pending tasks: wall time, records/s, Redis CPU, peak RSS.

A fresh redis-server (AOF on, appendfsync everysec so the load is quick, automatic AOF
rewrites off so no fork runs during a measurement) is loaded with N pending tasks of
1000 tenants over 64 shards, 100-byte payloads, due uniformly over the next 7 days (far
buckets, and the first horizon's worth in the near level after a promote). The records
and wheel members are written directly, in the layout lua/task_create.lua writes (packed
record in its body hash, member in its far bucket, the bucket in the wheel index, the
tenant's usage counts), on a
plain pipelined connection: 2-3 times faster than through the create script, and the
audit reporting no finding checks that the layout is the real one. Then DISPATCHED
(20,000) runs due now are created through the create script, promoted and ticked into
their ready streams, and a consumer group reads DELIVERED of them (pending entries).

The audit is `timewheel audit --json` run as a process (no scheduler runs, so its
lateness thresholds are set to an hour): its wall time, the records, entries and
members it read, its peak RSS (getrusage of the child), and Redis's CPU
(INFO cpu used_cpu_sys + used_cpu_user, before and after). Every audit call slower than
2 ms lands in the SLOWLOG, whose longest entry is the longest single call.

--continuous instead measures the continuous auditor's effect on dispatch, on one
server loaded with --tasks pending runs (as above) and PostgreSQL configured (a DSN in
the settings, so a pass ends with the archive and count checks; the archive is caught up
before every round, untimed, as a running archiver keeps it):

- the bound: one node's auditor alone (no scheduler) through its whole first pass,
  every Redis command logged (SLOWLOG, threshold 0, drained in MULTI): its Redis time per
  function and command, per record and per second, the node's CPU, Redis's and
  PostgreSQL's; set against the dispatch's Redis time a second (FCALL usec a run x the
  rate, rounds without the auditor). With dispatch bound by Redis, the auditor's share
  of Redis's time bounds its throughput effect.
- the measurement: --rounds pairs of rounds without and with the auditor, interleaved
  (A B, B A, ...), each on a fresh scheduler node in this process (the auditor in the
  same event loop and on the same connections as its ticks): --runs due runs loaded,
  promoted and archived (untimed), the host gauge (bench/dispatch.py's: ns per Lua
  redis.call), then with the auditor the node's auditor started and waited for until
  its first pass reads records (the defaults: a pass per 60 s, 1,000 a step, a first
  pass's steps 50 ms apart, canaries every 10 s); the node drains the runs
  (throughput), then bench/dispatch.py's load generator, in a process of its own,
  creates --rate a second (batched, through the create script) due 1 s after their
  create for --seconds (lag = dispatched_ms - due_ms from the ready streams). Each pair
  gives a ratio; the summary is the median of the pairs' ratios.

Writes audit-continuous.json.

Run:  .venv/bin/python bench/audit.py                    (1,000,000 tasks)
      .venv/bin/python bench/audit.py --tasks 5000000    (about 1 GiB of Redis memory, 5 min)
      .venv/bin/python bench/audit.py --quick            (100,000 tasks)
      .venv/bin/python bench/audit.py --quick --events --parallel 1 --parallel 1
                                                         (without and with --events)
      .venv/bin/python bench/audit.py --continuous --quick (6 A/B pairs, 100,000 pending)
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from common import percentile
from rawpipe import RawPipe, create_commands, resp

from timewheel import ids
from timewheel.config import Settings
from timewheel.engine import Engine
from timewheel.store import record as stored_record
from timewheel.store.bodies import BodyLayout
from timewheel.store.keys import Keys
from timewheel.store.server import RedisServer
from timewheel.tasks.model import NewTask

SHARDS = 64
TENANTS = 1000
QUEUE = "default"
PAYLOAD_BYTES = 100
SPREAD_MS = 7 * 86_400_000
DISPATCHED = 20_000
DELIVERED = 5_000
CHUNK = 20_000
RESULTS = Path(__file__).resolve().parent / "results" / "audit.json"
SLOW_US = 2_000
LATE_S = 3_600
_PAD = "x" * (PAYLOAD_BYTES - len('"task-0000000000-"'))


def payload_json(i: int) -> str:
    return f'"task-{i:010d}-{_PAD}"'


LEGACY = BodyLayout()


def record(due_ms: int, tenant: str, created_ms: int, payload: str) -> bytes:
    """A fresh task's record as lua/lib/record.lua packs it."""
    return stored_record.pack_fresh(due_ms, tenant, QUEUE, created_ms, payload)


def load_commands(
    keys: Keys, tasks: int, now_ms: int, promoted_until: int, bucket_ms: int
) -> Iterator[list[bytes]]:
    """HSETs of records and wheel members, and the wheel index, chunk by chunk."""
    rng = random.Random(1)
    tenants = [f"tenant-{i:04d}" for i in range(TENANTS)]
    shard_of = {t: ids.tenant_shards(t, 1, SHARDS)[0] for t in tenants}
    for start in range(0, tasks, CHUNK):
        bodies: dict[str, list[bytes | str]] = {}
        buckets: dict[str, list[bytes | str]] = {}
        near: dict[str, list[str | int]] = {}
        due_index: dict[str, dict[str, int]] = {}
        index: dict[str, set[int]] = {}
        usage: dict[str, list[int]] = {}  # lib/usage.lua: the runs of q:default, bytes
        for i in range(start, min(start + CHUNK, tasks)):
            tenant = tenants[i % TENANTS]
            shard = shard_of[tenant]
            task_id = ids.make_task_id(shard, ids.new_token())
            due = now_ms + 1 + rng.randrange(SPREAD_MS)
            # Shards with no body_bits in their meta: the layout of 1,024 't:<xy>' hashes
            # (store/bodies.py), which the first create keeps.
            body = bodies.setdefault(keys.body(shard, task_id, LEGACY), [])
            body += [keys.body_field(task_id, LEGACY), record(due, tenant, now_ms, payload_json(i))]
            held = usage.setdefault(keys.usage(shard, tenant), [0, 0])
            held[0] += 1
            held[1] += len(payload_json(i))
            if due < promoted_until:  # wheel_place: the near level
                near.setdefault(keys.near(shard, tenant), []).extend((due, task_id))
                first = due_index.setdefault(keys.due(shard), {})
                first[tenant] = min(first.get(tenant, due), due)
            else:
                bucket = due - due % bucket_ms
                members = buckets.setdefault(keys.bucket(shard, bucket), [])
                members += [keys.bucket_member(task_id), ""]
                index.setdefault(keys.wheel(shard), set()).add(bucket)
        commands = [resp(("HSET", key, *fields)) for key, fields in bodies.items()]
        commands += [resp(("HSET", key, *fields)) for key, fields in buckets.items()]
        commands += [resp(("ZADD", key, *pairs)) for key, pairs in near.items()]
        for key, (runs, size) in usage.items():
            commands.append(resp(("HINCRBY", key, f"q:{QUEUE}", runs)))
            commands.append(resp(("HINCRBY", key, "bytes", size)))
        for key, firsts in due_index.items():
            for tenant, due in firsts.items():
                commands.append(resp(("ZADD", key, "LT", due, tenant)))
        for key, starts in index.items():
            pairs: list[int] = []
            for b in sorted(starts):
                pairs += [b, b]
            commands.append(resp(("ZADD", key, *pairs)))
        yield commands


async def redis_cpu_s(client: aioredis.Redis) -> float:
    info: dict[str, Any] = await client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


async def fcall_stats(client: aioredis.Redis) -> dict[str, float]:
    stats: dict[str, Any] = await client.info("commandstats")
    out: dict[str, float] = {"calls": 0, "usec": 0}
    for name in ("cmdstat_fcall", "cmdstat_fcall_ro"):
        if name in stats:
            out["calls"] += int(stats[name]["calls"])
            out["usec"] += int(stats[name]["usec"])
    return out


async def load(url: str, settings: Settings, tasks: int) -> dict[str, Any]:
    engine = await Engine.connect(settings)
    client: aioredis.Redis = engine.client  # type: ignore[assignment]
    try:
        await engine.store.scripts.library.load(client)
        now = int(time.time() * 1000)
        for shard in range(SHARDS):
            await engine.dispatch.promote(shard)
        meta = await client.hget(engine.keys.meta(0), "promoted_until")
        promoted_until = int(meta or 0)
        started = time.monotonic()
        pipe = await RawPipe.open(url)
        try:
            commands = await pipe.run(
                load_commands(engine.keys, tasks, now, promoted_until, settings.bucket_ms)
            )
            loaded_s = time.monotonic() - started
            # Runs due now, through the create script, promoted and ticked into streams.
            news = [
                NewTask(
                    tenant=f"tenant-{i % TENANTS:04d}", delay_ms=0, payload_json=payload_json(i)
                )
                for i in range(DISPATCHED)
            ]
            batches = [
                create_commands(engine, news[i : i + 500])[0] for i in range(0, DISPATCHED, 500)
            ]
            await pipe.run(iter(batches))
        finally:
            await pipe.close()
        dispatched = 0
        for shard in range(SHARDS):
            while (await engine.dispatch.promote(shard)).more:
                pass
            while (tick := await engine.dispatch.tick(shard)).consumed:
                dispatched += tick.dispatched
        delivered = 0
        for shard in range(SHARDS):
            for tenant in (f"tenant-{i:04d}" for i in range(TENANTS)):
                if ids.tenant_shards(tenant, 1, SHARDS)[0] != shard:
                    continue
                stream = engine.keys.stream(shard, tenant, QUEUE)
                await engine.outcomes.register_group(stream, "bench")
                if delivered < DELIVERED:
                    got: Any = await client.xreadgroup("bench", "c1", {stream: ">"}, count=10)
                    delivered += sum(len(entries) for _, entries in got or [])
        return {
            "load_seconds": round(loaded_s, 1),
            "load_commands": commands,
            "dispatched": dispatched,
            "delivered": delivered,
        }
    finally:
        await engine.close()


def run_audit(
    url: str, prefix: str, parallel: int, events: bool
) -> tuple[dict[str, Any], float, int, int]:
    """`timewheel audit --json` (with `events`, --events) as a child process: its report,
    wall time, peak RSS (KiB) and exit status."""
    env = {**os.environ, "TIMEWHEEL_PREFIX": prefix}
    command = [sys.executable, "-m", "timewheel.cli", "audit", "--redis-url", url, "--json"]
    command += ["--events"] if events else []
    # No scheduler runs here: runs falling due and deliveries idling during the bench are
    # late by design, so the lateness thresholds are set past the bench's length.
    command += ["--parallel", str(parallel), "--log-level", "warning"]
    command += ["--overdue-s", str(LATE_S), "--lease-grace-s", str(LATE_S)]
    started = time.monotonic()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    out = proc.stdout.read()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - started
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"audit failed ({proc.returncode}): {err.decode()}")
    return json.loads(out), wall, usage.ru_maxrss, proc.returncode


async def measure(url: str, prefix: str, parallel: int, events: bool = False) -> dict[str, Any]:
    client = aioredis.Redis.from_url(url)
    try:
        await client.config_set("slowlog-log-slower-than", SLOW_US)
        await client.config_set("slowlog-max-len", 10_000)
        await client.slowlog_reset()
        cpu0, calls0 = await redis_cpu_s(client), await fcall_stats(client)
        report, wall, rss_kib, status = await asyncio.to_thread(
            run_audit, url, prefix, parallel, events
        )
        cpu1, calls1 = await redis_cpu_s(client), await fcall_stats(client)
        slow: Any = await client.slowlog_get(10_000)
    finally:
        await client.aclose()
    e = report["examined"]
    calls = calls1["calls"] - calls0["calls"]
    usec = calls1["usec"] - calls0["usec"]
    audit_slow = [x for x in slow if x["command"].upper().startswith(b"FCALL")]
    longest = max((x["duration"] for x in audit_slow), default=0)
    slowest: dict[str, int] = {}
    for x in audit_slow:  # tw_<version>_<operation>: the longest call of each operation
        op = x["command"].split()[1].decode().split("_", 2)[-1]
        slowest[op] = max(slowest.get(op, 0), x["duration"])
    return {
        "parallel": parallel,
        "events": events,
        "exit_status": status,
        "findings": report["findings_total"],
        "counts": report["counts"],
        "wall_seconds": round(wall, 2),
        "pass_seconds": report["seconds"],
        "records": e["records"],
        "members": e["members"],
        "members_read": e["members_read"],
        "entries": e["entries"],
        "schedules": e["schedules"],
        "key_names": e["keys"],
        "records_per_s": round(e["records"] / report["seconds"]),
        "redis_cpu_seconds": round(cpu1 - cpu0, 2),
        "redis_cpu_us_per_record": round((cpu1 - cpu0) * 1e6 / max(1, e["records"]), 2),
        "audit_calls": int(calls),
        "audit_call_usec_mean": round(usec / max(1, calls), 1),
        "audit_calls_over_2ms": len(audit_slow),
        "longest_call_ms": round(longest / 1000, 2),
        "longest_call_ms_by_operation": {op: round(us / 1000, 2) for op, us in slowest.items()},
        "peak_rss_mib": round(rss_kib / 1024, 1),
    }


# -- the continuous auditor's effect on dispatch ------------------------------------------

AUDIT_INTERVAL_MS = 60_000
LEASE_TTL_MS = 10_000
"""The bench nodes' lease TTL (the default is 2 s): on this shared host a node's first
passes over the drained runs outlast 2 s and it loses every lease mid-drain, with or
without the auditor, which would measure lease churn rather than the auditor."""
WARM_TIMEOUT_S = 30.0
DRAIN_TIMEOUT_S = 120.0
SETTLE_S = 2.0
SLOWLOG_ALL_LEN = 200_000
"""SLOWLOG entries kept while the auditor runs alone (every command is logged)."""
MAIN_THREAD_CPU = ("used_cpu_user_main_thread", "used_cpu_sys_main_thread")


def median(values: list[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    if not n:
        return 0.0
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


async def redis_gauges(client: aioredis.Redis) -> dict[str, float]:
    """Redis main-thread CPU (s) and the FCALL calls and usec of INFO commandstats."""
    cpu: dict[str, Any] = await client.info("cpu")
    stats: dict[str, Any] = await client.info("commandstats")
    fcall = stats.get("cmdstat_fcall") or {}
    return {
        "cpu_s": sum(float(cpu[k]) for k in MAIN_THREAD_CPU),
        "fcall_calls": int(fcall.get("calls", 0)),
        "fcall_usec": int(fcall.get("usec", 0)),
    }


def postgres_cpu_s(pid: int) -> float:
    """CPU seconds of the postmaster `pid`, its live backends and those that ended."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # fields[0] is the state (stat's 3rd field): ppid 1, utime 11, stime 12, cutime 13...
        if int(stat.parent.name) == pid:
            total += sum(int(f) for f in fields[11:15])
        elif int(fields[1]) == pid:
            total += int(fields[11]) + int(fields[12])
    return total / tick


async def archive_catch_up(settings: Settings) -> int:
    """Archive every event-log entry not archived yet (untimed, between rounds), so the
    auditor's archive and count checks read an archive as current as a running archiver
    keeps it; returns the entries archived."""
    from timewheel.archive import pg
    from timewheel.archive.archiver import Archiver

    engine = await Engine.connect(settings)
    conn = await pg.connect(settings.postgres_dsn)
    try:
        archiver = Archiver(engine.store, conn)
        await archiver.start()
        total = 0
        while count := await archiver.run_once():
            total += count
        return total
    finally:
        await conn.close()
        await engine.close()


def _auditor(engine: Engine, name: str) -> Any:
    from prometheus_client import CollectorRegistry

    from timewheel.audit.continuous import ContinuousAuditor
    from timewheel.dispatch.metrics import AuditorMetrics

    metrics = AuditorMetrics(CollectorRegistry())
    return ContinuousAuditor(engine.store, name, LEASE_TTL_MS, metrics, lambda: [name])


def _pass_records(audit: Any) -> int:
    """Records a pass has read: its finished shards' and the one in progress."""
    if audit is None:
        return 0
    current = getattr(audit, "_current", None)
    return int(audit.examined.records) + (0 if current is None else current.examined.records)


def _pass_calls(audit: Any) -> int:
    """Audit calls a pass has made: its finished shards' and the one in progress."""
    if audit is None:
        return 0
    current = getattr(audit, "_current", None)
    return int(audit.examined.calls) + (0 if current is None else current.examined.calls)


def _records(duty: Any) -> int:
    return 0 if duty is None else _pass_records(duty.current)


class SlowlogTally:
    """Every command's Redis time from the SLOWLOG (threshold 0), drained in MULTI
    (SLOWLOG GET, SLOWLOG RESET) so none is lost between the two. Commands run inside a
    function (client address '?:0') are inside their FCALL's time: tallied apart, not
    added. The bench's own commands (INFO, SLOWLOG, CONFIG, MULTI, EXEC) are left out."""

    BENCH = frozenset({"INFO", "SLOWLOG", "CONFIG", "MULTI", "EXEC"})

    def __init__(self) -> None:
        self.functions: dict[str, list[int]] = {}
        self.commands: dict[str, list[int]] = {}
        self.inner: dict[str, list[int]] = {}
        self.cpu_s = 0.0
        """This process's CPU spent draining (not the auditor's)."""

    async def drain(self, client: aioredis.Redis) -> None:
        cpu = time.process_time()
        try:
            await self._drain(client)
        finally:
            self.cpu_s += time.process_time() - cpu

    async def _drain(self, client: aioredis.Redis) -> None:
        pipe = client.pipeline(transaction=True)
        pipe.slowlog_get(SLOWLOG_ALL_LEN)
        pipe.slowlog_reset()
        entries: Any = (await pipe.execute())[0]
        for entry in entries:
            words = entry["command"].split()
            command = words[0].decode().upper()
            if command in self.BENCH:
                continue
            if entry["client_address"] == b"?:0":
                slot = self.inner.setdefault(command, [0, 0])
            elif command == "FCALL":
                slot = self.functions.setdefault(words[1].decode().split("_", 2)[-1], [0, 0])
            else:
                slot = self.commands.setdefault(command, [0, 0])
            slot[0] += 1
            slot[1] += int(entry["duration"])

    def usec(self) -> int:
        return sum(v[1] for v in [*self.functions.values(), *self.commands.values()])

    @staticmethod
    def table(tally: dict[str, list[int]]) -> dict[str, dict[str, int]]:
        ranked = sorted(tally.items(), key=lambda kv: -kv[1][1])
        return {k: {"calls": v[0], "usec": v[1]} for k, v in ranked}


ALONE_WINDOW_S = 180.0
"""Longest the auditor-alone measurement runs (a pass, or the part of one it holds)."""


async def auditor_alone(settings: Settings, pg_pid: int, name: str) -> dict[str, Any]:
    """The deterministic side: one node's auditor alone (no scheduler, nothing else on
    Redis) through its whole first pass, every Redis command in the SLOWLOG (threshold
    0), so that its Redis time is summed per function and command; its process's CPU
    (this process does nothing else meanwhile), Redis's main-thread CPU and
    PostgreSQL's."""
    from dispatch import host_gauge

    gauge = await host_gauge(settings.redis_url)
    settings = dataclasses.replace(settings, audit_interval_ms=AUDIT_INTERVAL_MS)
    engine = await Engine.connect(settings)
    client: aioredis.Redis = engine.client  # type: ignore[assignment]
    stop = asyncio.Event()
    duty = _auditor(engine, name)
    task = asyncio.create_task(duty.run(stop))
    tally = SlowlogTally()
    try:
        deadline = time.monotonic() + 60
        while duty.current is None:  # the lease, then START_DELAY_S
            if task.done() or time.monotonic() > deadline:
                raise SystemExit(f"the auditor did not start a pass: {task}")
            await asyncio.sleep(0.005)
        await client.config_set("slowlog-max-len", SLOWLOG_ALL_LEN)
        await client.config_set("slowlog-log-slower-than", 0)
        await client.slowlog_reset()
        g0, pg0, cpu0 = await redis_gauges(client), postgres_cpu_s(pg_pid), time.process_time()
        started = time.perf_counter()
        audit = duty.current
        # The pass, or as much of it as ALONE_WINDOW_S holds: kept to audit_max_share of
        # the time, a pass of this size takes longer than the window on a slow host.
        while duty.passes < 1 and time.perf_counter() - started < ALONE_WINDOW_S:
            audit = duty.current or audit
            if task.done():
                raise SystemExit(f"the auditor stopped: {task}")
            await asyncio.sleep(0.25)
            await tally.drain(client)
        complete = duty.passes >= 1
        wall = time.perf_counter() - started
        cpu1 = time.process_time() - tally.cpu_s
        pg1, g1 = postgres_cpu_s(pg_pid), await redis_gauges(client)
        await client.config_set("slowlog-log-slower-than", 10_000)
        await tally.drain(client)
    finally:
        stop.set()
        await asyncio.gather(task, return_exceptions=True)
        await engine.close()
    redis_us = tally.usec()
    records = audit.examined.records
    return {
        "host_gauge": gauge,
        "pass_seconds": round(wall, 2),
        "pass_complete": complete,
        "audit_max_share": settings.audit_max_share,
        "redis_share_of_wall_pct": round(100 * tally.usec() / (wall * 1e6), 2),
        "examined": audit.examined.to_json(),
        "redis_us": redis_us,
        "redis_us_per_record": round(redis_us / max(1, records), 2),
        "redis_us_per_audit_call": round(redis_us / max(1, audit.examined.calls)),
        "redis_us_per_s_first_pass": round(redis_us / wall),
        # A pass every interval, or back to back when one takes longer (kept to its share).
        "redis_us_per_s_steady": round(
            redis_us / (max(AUDIT_INTERVAL_MS / 1000, wall) if complete else wall)
        ),
        "fcall_usec_commandstats": g1["fcall_usec"] - g0["fcall_usec"],
        "fcall_usec_slowlog": sum(v[1] for v in tally.functions.values()),
        "redis_main_thread_cpu_s": round(g1["cpu_s"] - g0["cpu_s"], 3),
        "node_cpu_s": round(cpu1 - cpu0, 3),
        "postgres_cpu_s": round(pg1 - pg0, 3),
        "by_function": tally.table(tally.functions),
        "by_command": tally.table(tally.commands),
        "inside_functions": tally.table(tally.inner),
    }


async def _warm(duty: Any, task: asyncio.Task[None]) -> float:
    """Wait until the auditor's first pass reads records (past the lease, START_DELAY_S
    and the key SCAN); returns the seconds waited."""
    started = time.perf_counter()
    while _records(duty) == 0:
        if task.done() or time.perf_counter() - started > WARM_TIMEOUT_S:
            raise SystemExit(f"the auditor read no record in time: {task}")
        await asyncio.sleep(0.01)
    return time.perf_counter() - started


async def _steady_lags(client: aioredis.Redis, phase_ms: int, created: set[str]) -> list[int]:
    """dispatched_ms - due_ms of the steady phase's runs, from the ready streams."""
    lags = []
    async for raw in client.scan_iter(match="{tw:*}:q:*", count=1000):
        entries: Any = await client.xrange(raw, min=str(phase_ms))
        for _, f in entries:
            if f[b"run_id"].decode() in created:
                lags.append(int(f[b"dispatched_ms"]) - int(f[b"due_ms"]))
    if len(lags) != len(created):
        raise SystemExit(f"{len(created) - len(lags)} runs of the steady phase not dispatched")
    return lags


async def _node_round(
    url: str, settings: Settings, auditor: bool, args: argparse.Namespace, name: str, work: Path
) -> dict[str, Any]:
    """One round on a fresh scheduler node in this process (the auditor, when on, in
    the same event loop and on the same connections as its ticks, as `timewheel
    scheduler` runs it): `--runs` due runs loaded and promoted and the archive caught
    up (untimed), the host gauge, then with `auditor` the node's auditor started and
    waited for until its first pass reads records; then the node's scheduler drains the
    runs (throughput), and a load-generator process (bench/dispatch.py's, batched
    creates through the create script) creates `--rate` a second due 1 s later for
    `--seconds` (lag from the ready streams)."""
    from dispatch import host_gauge, load_due, result_line, spawn, wait_process

    from timewheel.dispatch.scheduler import Scheduler

    node_settings = dataclasses.replace(settings, audit_interval_ms=AUDIT_INTERVAL_MS)
    engine = await Engine.connect(node_settings)
    client: aioredis.Redis = engine.client  # type: ignore[assignment]
    stop = asyncio.Event()
    duty: Any = None
    helpers: list[asyncio.Task[None]] = []
    load_log, ids_path = work / f"{name}-load.log", work / f"{name}-created.ids"
    try:
        await load_due(engine, url, args.runs, 500)
        for shard in range(SHARDS):
            while (await engine.dispatch.promote(shard)).more:
                pass
        archived = await archive_catch_up(settings)
        gauge = await host_gauge(url)
        warm_s = 0.0
        if auditor:
            duty = _auditor(engine, name)
            helpers.append(asyncio.create_task(duty.run(stop)))
            warm_s = await _warm(duty, helpers[0])
        scheduler = Scheduler(engine.store, node=name, lease_ttl_ms=LEASE_TTL_MS)
        scheduler.auditor = None  # `duty` above is this node's auditor
        audit = None if duty is None else duty.current  # this pass, also once it ended

        def read() -> int:
            return _pass_records(audit)

        g0, read0, cpu0 = await redis_gauges(client), read(), time.process_time()
        calls0 = _pass_calls(audit)
        started = time.perf_counter()
        helpers.append(asyncio.create_task(scheduler.run(stop)))
        while scheduler.counters.dispatched < args.runs:
            await asyncio.sleep(0.005)
            if helpers[-1].done() or time.perf_counter() - started > DRAIN_TIMEOUT_S:
                raise SystemExit(f"dispatch did not finish: {helpers[-1]}")
        drained_s = time.perf_counter() - started
        cpu1, read1, g1 = time.process_time(), read(), await redis_gauges(client)
        calls1 = _pass_calls(audit)
        # the steady phase, its creates from another process
        phase_ms = int((await client.time())[0]) * 1000
        load = spawn(
            [
                "_load", "--url", url, "--rate", str(args.rate), "--seconds", str(args.seconds),
                "--interval-ms", "10", "--ids", str(ids_path),
            ],
            load_log,
        )  # fmt: skip
        code = await wait_process(load, args.seconds + 60)
        load_result = result_line(load_log)
        if code != 0 or load_result is None:
            raise SystemExit(f"load generator failed ({code}): {load_log.read_text()[-2000:]}")
        await asyncio.sleep(SETTLE_S)
        read2, calls2 = read(), _pass_calls(audit)
        lost = sum(
            sample.value
            for metric in scheduler.metrics.lease_lost.collect()
            for sample in metric.samples
            if sample.name.endswith("_total")
        )
        passes = 0 if duty is None else duty.passes
        # a failed step begins a fresh pass: this round's pass is then not the current one
        restarted = duty is not None and passes == 0 and duty.current is not audit
        stop.set()
        await asyncio.gather(*helpers)
        lags = await _steady_lags(client, phase_ms, set(ids_path.read_text().split()))
        fcall_us = g1["fcall_usec"] - g0["fcall_usec"]
        return {
            "auditor": auditor,
            "host_gauge": gauge,
            "archived_before": archived,
            "auditor_warm_seconds": round(warm_s, 2),
            "drain_seconds": round(drained_s, 3),
            "throughput_per_s": round(args.runs / drained_s),
            "drain_fcall_us_per_run": round(fcall_us / args.runs, 2),
            "drain_redis_cpu_us_per_run": round((g1["cpu_s"] - g0["cpu_s"]) * 1e6 / args.runs, 2),
            "drain_node_cpu_us_per_run": round((cpu1 - cpu0) * 1e6 / args.runs, 2),
            "drain_redis_fcall_share": round(fcall_us / 1e6 / drained_s, 3),
            "records_audited_during_drain": read1 - read0,
            "records_audited_during_steady": max(0, read2 - read1),
            "audit_calls_during_drain": calls1 - calls0,
            "audit_calls_during_steady": calls2 - calls1,
            "audit_passes_done": passes,
            "audit_pass_restarted": restarted,
            "leases_lost": int(lost),
            "load_achieved_per_s": load_result["achieved_per_s"],
            "load_batch_ms_p99": load_result["batch_ms_p99"],
            "lag_runs": len(lags),
            "lag_p50_ms": percentile(lags, 50),
            "lag_p99_ms": percentile(lags, 99),
            "lag_max_ms": max(lags),
        }
    finally:
        stop.set()
        await asyncio.gather(*helpers, return_exceptions=True)
        await engine.close()


def _pairs(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each pair's rounds (A B or B A, next to each other in time) and their ratios."""
    out = []
    for i in range(0, len(rounds) - 1, 2):
        a, b = sorted(rounds[i : i + 2], key=lambda r: r["auditor"])
        out.append(
            {
                "pair": i // 2 + 1,
                "order": "AB" if not rounds[i]["auditor"] else "BA",
                "throughput_without": a["throughput_per_s"],
                "throughput_with": b["throughput_per_s"],
                "throughput_ratio": round(b["throughput_per_s"] / a["throughput_per_s"], 3),
                "lag_p99_without_ms": a["lag_p99_ms"],
                "lag_p99_with_ms": b["lag_p99_ms"],
                "lag_p99_diff_ms": b["lag_p99_ms"] - a["lag_p99_ms"],
                "lag_max_diff_ms": b["lag_max_ms"] - a["lag_max_ms"],
                "host_gauge_ns": [
                    a["host_gauge"]["redis_call_ns"],
                    b["host_gauge"]["redis_call_ns"],
                ],
            }
        )
    return out


def _bound(alone: dict[str, Any], rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The auditor's Redis time a second against the dispatch's Redis time a second
    (its FCALL usec a run x its rate, rounds without the auditor): with dispatch bound
    by Redis, the auditor's share of Redis's time bounds its effect on throughput. The
    same for the node's CPU, and for all the CPU of both (Redis, node, and PostgreSQL's
    for the auditor), for a host whose cores are what bounds it."""
    without = [r for r in rounds if not r["auditor"]]
    us_run = median([r["drain_fcall_us_per_run"] for r in without])
    cpu_us_run = median([r["drain_redis_cpu_us_per_run"] for r in without])
    node_us_run = median([r["drain_node_cpu_us_per_run"] for r in without])
    rate = median([r["throughput_per_s"] for r in without])
    dispatch_us_s = us_run * rate
    first, steady = alone["redis_us_per_s_first_pass"], alone["redis_us_per_s_steady"]
    node_first = alone["node_cpu_s"] / alone["pass_seconds"] * 1e6
    node_steady = node_first * steady / max(1, first)  # the same pace as its Redis time
    # CPU seconds: the auditor's whole pass; the dispatch's a second
    cpu_pass = alone["redis_main_thread_cpu_s"] + alone["node_cpu_s"] + alone["postgres_cpu_s"]
    cpu_s = (cpu_us_run + node_us_run) * rate / 1e6
    # In the drains with the auditor, its Redis time estimated two ways from the pass
    # alone: the records it read there x its Redis time a record (all of it, streams,
    # members and SCAN included), and its audit calls there x its time a call; the larger.
    per_record = alone["redis_us"] / max(1, alone["examined"]["records"])
    in_drains = [
        max(
            r["records_audited_during_drain"] * per_record,
            r.get("audit_calls_during_drain", 0) * alone["redis_us_per_audit_call"],
        )
        / r["drain_seconds"]
        for r in rounds
        if r["auditor"]
    ]
    return {
        "dispatch_fcall_us_per_run": us_run,
        "dispatch_redis_cpu_us_per_run": cpu_us_run,
        "dispatch_node_cpu_us_per_run": node_us_run,
        "dispatch_rate_per_s": rate,
        "dispatch_redis_us_per_s": round(dispatch_us_s),
        "dispatch_node_cpu_us_per_s": round(node_us_run * rate),
        "auditor_redis_us_per_s_first_pass": first,
        "auditor_redis_us_per_s_steady": steady,
        "auditor_node_cpu_us_per_s_first_pass": round(node_first),
        "auditor_node_cpu_us_per_s_steady": round(node_steady),
        "redis_share_first_pass_pct": round(100 * first / dispatch_us_s, 2),
        "redis_share_steady_pct": round(100 * steady / dispatch_us_s, 2),
        "node_cpu_share_first_pass_pct": round(100 * node_first / (node_us_run * rate), 2),
        "node_cpu_share_steady_pct": round(100 * node_steady / (node_us_run * rate), 2),
        "auditor_redis_us_per_s_in_drains_est": round(median(in_drains)),
        "redis_share_in_drains_est_pct": round(100 * median(in_drains) / dispatch_us_s, 2),
        "cpu_share_first_pass_pct": round(100 * cpu_pass / alone["pass_seconds"] / cpu_s, 2),
        "cpu_share_steady_pct": round(100 * cpu_pass / (AUDIT_INTERVAL_MS / 1000) / cpu_s, 2),
    }


def continuous(args: argparse.Namespace) -> None:
    """The auditor alone through one pass (its Redis time, deterministic), then
    interleaved pairs of rounds without and with it (A B, B A, ...), on one server
    loaded with `--tasks` pending runs, PostgreSQL configured."""
    from timewheel.testing.postgres import PostgresServer

    data_dir = Path(tempfile.mkdtemp(prefix="tw-bench-audit-ab-"))
    work = data_dir / "work"
    work.mkdir()
    server = RedisServer(
        data_dir / "redis",
        appendfsync="everysec",
        extra_config={"auto-aof-rewrite-percentage": "0"},
    )
    postgres = PostgresServer()
    rounds: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        server.start()
        postgres.start()
        dsn = postgres.create_database()
        pg_pid = int((postgres.data / "postmaster.pid").read_text().split()[0])
        # The load's delivered entries must not come back through the reaper during a
        # round: an hour's visibility timeout.
        settings = Settings(
            redis_url=server.url,
            shards=SHARDS,
            visibility_timeout_ms=3_600_000,
            postgres_dsn=dsn,
        )
        loaded = asyncio.run(load(server.url, settings, args.tasks))
        loaded["archived"] = asyncio.run(archive_catch_up(settings))
        print(json.dumps({"loaded": loaded}), flush=True)
        alone = asyncio.run(auditor_alone(settings, pg_pid, "bench-alone"))
        print(json.dumps({"auditor_alone": alone}), flush=True)
        for i in range(args.rounds):
            for auditor in (False, True) if i % 2 == 0 else (True, False):
                r = asyncio.run(
                    _node_round(server.url, settings, auditor, args, f"bench-{len(rounds)}", work)
                )
                rounds.append(r)
                print(json.dumps(r), flush=True)
    finally:
        server.stop()
        postgres.stop()
        shutil.rmtree(data_dir, ignore_errors=True)

    pairs = _pairs(rounds)
    ratios = [p["throughput_ratio"] for p in pairs]
    kinds = {"without": False, "with": True}
    summary: dict[str, Any] = {
        "throughput_ratio_median": round(median(ratios), 3),
        "throughput_loss_pct_median": round(100 * (1 - median(ratios)), 1),
        "throughput_ratio_range": [min(ratios), max(ratios)],
        "pairs_with_loss_over_5_pct": sum(1 for x in ratios if x < 0.95),
        "lag_p99_diff_ms_median": median([p["lag_p99_diff_ms"] for p in pairs]),
        "lag_max_diff_ms_median": median([p["lag_max_diff_ms"] for p in pairs]),
        **{
            f"{key}_median": {
                k: median([float(r[key]) for r in rounds if r["auditor"] is v])
                for k, v in kinds.items()
            }
            for key in ("throughput_per_s", "lag_p50_ms", "lag_p99_ms", "lag_max_ms")
        },
        "host_gauge_redis_call_ns_range": [
            min(r["host_gauge"]["redis_call_ns"] for r in rounds),
            max(r["host_gauge"]["redis_call_ns"] for r in rounds),
        ],
    }
    bound = _bound(alone, rounds)
    print(json.dumps({"pairs": pairs, "summary": summary, "bound": bound}, indent=1), flush=True)
    out = {
        "parameters": {
            "pending_tasks": args.tasks,
            "shards": SHARDS,
            "runs_per_round": args.runs,
            "steady_rate_per_s": args.rate,
            "steady_seconds": args.seconds,
            "pairs": args.rounds,
            "audit_interval_ms": AUDIT_INTERVAL_MS,
            "appendfsync": "everysec",
            "postgres": "configured (timewheel/testing/postgres.py, fsync off)",
            "seconds": round(time.monotonic() - started, 1),
        },
        "load": loaded,
        "summary": summary,
        "bound": bound,
        "auditor_alone": alone,
        "pairs": pairs,
        "rounds": rounds,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help="100,000 tasks")
    parser.add_argument("--parallel", type=int, action="append", help="audit runs (default 1, 4)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--events",
        action="store_true",
        help="each audit run without and with --events (event logs, usage fields), in turn; "
        "writes audit-events.json",
    )
    parser.add_argument(
        "--continuous",
        action="store_true",
        help="the continuous auditor's effect on dispatch, interleaved A/B rounds",
    )
    parser.add_argument("--rounds", type=int, default=6, help="A/B pairs (--continuous)")
    parser.add_argument("--runs", type=int, default=50_000, help="due runs drained per round")
    parser.add_argument("--rate", type=int, default=5_000, help="steady creates per second")
    parser.add_argument("--seconds", type=float, default=5.0, help="steady phase length")
    args = parser.parse_args()
    if args.continuous:
        if args.out == RESULTS:
            args.out = RESULTS.with_name("audit-continuous.json")
        if args.quick:
            args.tasks = 100_000
        continuous(args)
        return
    tasks = 100_000 if args.quick else args.tasks
    runs = args.parallel or [1, 4]
    if args.events and args.out == RESULTS:
        args.out = RESULTS.with_name("audit-events.json")
    data_dir = Path(tempfile.mkdtemp(prefix="tw-bench-audit-"))
    server = RedisServer(
        data_dir, appendfsync="everysec", extra_config={"auto-aof-rewrite-percentage": "0"}
    )
    started = time.monotonic()
    try:
        server.start()
        settings = Settings(redis_url=server.url, shards=SHARDS)
        loaded = asyncio.run(load(server.url, settings, tasks))
        info: Any = asyncio.run(_memory(server.url))
        print(
            f"loaded {tasks:,} pending tasks in {loaded['load_seconds']} s, "
            f"{loaded['dispatched']:,} dispatched, {loaded['delivered']:,} delivered; "
            f"Redis {info['used_memory'] / 2**20:,.0f} MiB",
            flush=True,
        )
        results = []
        rounds = [(p, e) for p in runs for e in ((False, True) if args.events else (False,))]
        for parallel, events in rounds:
            r = asyncio.run(measure(server.url, settings.prefix, parallel, events))
            results.append(r)
            print(
                f"audit --parallel {parallel}{' --events' if events else ''}: "
                f"{r['wall_seconds']} s wall, "
                f"{r['records_per_s']:,} records/s ({r['records']:,} records, "
                f"{r['members']:,} wheel members, {r['entries']:,} entries), Redis CPU "
                f"{r['redis_cpu_seconds']} s ({r['redis_cpu_us_per_record']} us/record), "
                f"{r['audit_calls']:,} calls of {r['audit_call_usec_mean']} us mean, longest "
                f"{r['longest_call_ms']} ms, peak RSS {r['peak_rss_mib']} MiB, "
                f"findings {r['findings']}; longest by operation "
                f"{r['longest_call_ms_by_operation']}",
                flush=True,
            )
            if r["findings"]:
                raise SystemExit(f"a freshly loaded deployment has findings: {r['counts']}")
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    out = {
        "parameters": {
            "tasks": tasks,
            "shards": SHARDS,
            "tenants": TENANTS,
            "payload_bytes": PAYLOAD_BYTES,
            "spread_days": SPREAD_MS // 86_400_000,
            "dispatched": DISPATCHED,
            "delivered": DELIVERED,
            "redis_used_memory_mib": round(info["used_memory"] / 2**20),
            "seconds": round(time.monotonic() - started, 1),
            "bench_peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        },
        "load": loaded,
        "audits": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


async def _memory(url: str) -> dict[str, Any]:
    client = aioredis.Redis.from_url(url)
    try:
        info: dict[str, Any] = await client.info("memory")
        return info
    finally:
        await client.aclose()


if __name__ == "__main__":
    main()
