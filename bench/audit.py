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

--continuous instead measures the continuous auditor's effect on dispatch: on one server
loaded with --tasks pending runs (as above), rounds without and with the auditor, in
turn (A B, B A, ...), each on a fresh in-process scheduler node (a node id, leases, the
auditor lease): --runs due runs drained (throughput), then --rate creates a second due
1 s after their create for --seconds (lag = dispatched_ms - due_ms from the ready
streams). With the auditor the node runs the defaults (a pass per 60 s, 1,000 a step,
its first pass's steps 50 ms apart, canaries every 10 s), started --warmup seconds before
the drain so that it is reading records, past its SCAN, while the node dispatches; the
rounds without it wait as long. Writes audit-continuous.json.

Run:  .venv/bin/python bench/audit.py                    (1,000,000 tasks)
      .venv/bin/python bench/audit.py --tasks 5000000    (about 1 GiB of Redis memory, 5 min)
      .venv/bin/python bench/audit.py --quick            (100,000 tasks)
      .venv/bin/python bench/audit.py --quick --events --parallel 1 --parallel 1
                                                         (without and with --events)
      .venv/bin/python bench/audit.py --continuous --quick (A/B, 100,000 pending)
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

import msgpack
import redis.asyncio as aioredis
from common import percentile
from rawpipe import RawPipe, create_commands, resp

from timewheel import ids
from timewheel.config import Settings
from timewheel.engine import Engine
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


def record(due_ms: int, tenant: str, created_ms: int, payload: str) -> bytes:
    """A fresh task's record as lua/lib/record.lua packs it (trailing nils left out)."""
    return b"".join(msgpack.packb(v) for v in (0, 0, due_ms, tenant, QUEUE, created_ms, payload))


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
            body = bodies.setdefault(keys.body(shard, task_id), [])
            body += [keys.body_field(task_id), record(due, tenant, now_ms, payload_json(i))]
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


async def _node_round(
    url: str, base: Settings, auditor: bool, args: argparse.Namespace, name: str
) -> dict[str, Any]:
    """One round on one scheduler node, in this process: `--runs` due runs drained
    (throughput), then `--rate` creates a second due 1 s after their create for
    `--seconds` (lag from the ready streams). With `auditor`, the node's continuous
    auditor (the defaults: a pass per 60 s, 1,000 a step, canaries every 10 s) holds its
    lease from `--warmup` seconds before the drain, so it is into its pass (past the
    SCAN, reading records) while the node dispatches; without, the node waits as long."""
    from dispatch import load_due
    from prometheus_client import CollectorRegistry

    from timewheel.audit.continuous import ContinuousAuditor
    from timewheel.dispatch.metrics import AuditorMetrics
    from timewheel.dispatch.scheduler import Scheduler

    settings = dataclasses.replace(base, audit_interval_ms=60_000)
    engine = await Engine.connect(settings)
    client: aioredis.Redis = engine.client  # type: ignore[assignment]
    stop = asyncio.Event()
    duty: ContinuousAuditor | None = None
    helpers: list[asyncio.Task[None]] = []
    try:
        if auditor:
            duty = ContinuousAuditor(
                engine.store, name, 2000, AuditorMetrics(CollectorRegistry()), lambda: [name]
            )
            helpers.append(asyncio.create_task(duty.run(stop)))
        warm_until = time.perf_counter() + args.warmup
        await load_due(engine, url, args.runs, 500)
        for shard in range(SHARDS):
            while (await engine.dispatch.promote(shard)).more:
                pass
        await asyncio.sleep(max(0.0, warm_until - time.perf_counter()))
        read_before = 0 if duty is None or duty.current is None else duty.current.examined.records
        scheduler = Scheduler(engine.store, node=name, lease_ttl_ms=2000)
        scheduler.auditor = None  # the duty above is this node's auditor
        started = time.perf_counter()
        helpers.append(asyncio.create_task(scheduler.run(stop)))
        while scheduler.counters.dispatched < args.runs:
            await asyncio.sleep(0.005)
            if helpers[-1].done() or time.perf_counter() - started > 120:
                raise SystemExit(f"dispatch did not finish: {helpers[-1]}")
        drained_s = time.perf_counter() - started
        # the steady phase: its runs' entries are those after its start in the streams
        phase_ms = int((await client.time())[0]) * 1000
        per_batch = max(1, args.rate // 20)
        deadline = time.perf_counter() + args.seconds
        created: set[str] = set()
        i = 0
        while time.perf_counter() < deadline:
            batch = [
                NewTask(f"tenant-{(i + j) % TENANTS:04d}", delay_ms=1000, payload_json="1")
                for j in range(per_batch)
            ]
            i += per_batch
            created |= {c.task_id for c in await engine.tasks.create_many(batch)}
            await asyncio.sleep(0.05)
        await asyncio.sleep(2.0)
        passes = 0 if duty is None else duty.passes
        read = 0 if duty is None or duty.current is None else duty.current.examined.records
        stop.set()
        await asyncio.gather(*helpers)
        lags = []
        async for raw in client.scan_iter(match="{tw:*}:q:*", count=1000):
            entries: Any = await client.xrange(raw, min=str(phase_ms))
            for _, f in entries:
                if f[b"run_id"].decode() in created:
                    lags.append(int(f[b"dispatched_ms"]) - int(f[b"due_ms"]))
        if len(lags) != len(created):
            raise SystemExit(f"{len(created) - len(lags)} runs of the steady phase not dispatched")
        return {
            "auditor": auditor,
            "throughput_per_s": round(args.runs / drained_s),
            "lag_runs": len(lags),
            "lag_p50_ms": percentile(lags, 50),
            "lag_p99_ms": percentile(lags, 99),
            "lag_max_ms": max(lags),
            "audit_passes_done": passes,
            "records_audited_during_round": max(0, read - read_before),
        }
    finally:
        stop.set()
        await asyncio.gather(*helpers, return_exceptions=True)
        await engine.close()


def continuous(args: argparse.Namespace) -> None:
    """Interleaved rounds without and with the continuous auditor, on one server loaded
    with `--tasks` pending runs for the auditor to read."""
    data_dir = Path(tempfile.mkdtemp(prefix="tw-bench-audit-ab-"))
    server = RedisServer(
        data_dir, appendfsync="everysec", extra_config={"auto-aof-rewrite-percentage": "0"}
    )
    rounds: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        server.start()
        # The load's delivered entries must not come back through the reaper during a
        # round: an hour's visibility timeout.
        settings = Settings(redis_url=server.url, shards=SHARDS, visibility_timeout_ms=3_600_000)
        asyncio.run(load(server.url, settings, args.tasks))
        for i in range(args.rounds):
            for auditor in (False, True) if i % 2 == 0 else (True, False):
                r = asyncio.run(
                    _node_round(server.url, settings, auditor, args, f"bench-{len(rounds)}")
                )
                rounds.append(r)
                print(json.dumps(r), flush=True)
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)

    def mean(key: str, auditor: bool) -> float:
        values = [float(r[key]) for r in rounds if r["auditor"] is auditor]
        return sum(values) / len(values)

    summary = {
        key: {"without": round(mean(key, False), 1), "with": round(mean(key, True), 1)}
        for key in ("throughput_per_s", "lag_p50_ms", "lag_p99_ms", "lag_max_ms")
    }
    loss = 1 - summary["throughput_per_s"]["with"] / summary["throughput_per_s"]["without"]
    summary["throughput_loss_pct"] = {"with": round(100 * loss, 1), "without": 0.0}
    print(json.dumps(summary, indent=1), flush=True)
    out = {
        "parameters": {
            "pending_tasks": args.tasks,
            "shards": SHARDS,
            "runs_per_round": args.runs,
            "steady_rate_per_s": args.rate,
            "steady_seconds": args.seconds,
            "warmup_seconds": args.warmup,
            "rounds": len(rounds),
            "appendfsync": "everysec",
            "seconds": round(time.monotonic() - started, 1),
        },
        "summary": summary,
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
    parser.add_argument("--rounds", type=int, default=3, help="A/B pairs (--continuous)")
    parser.add_argument("--runs", type=int, default=50_000, help="due runs drained per round")
    parser.add_argument("--rate", type=int, default=500, help="steady creates per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="steady phase length")
    parser.add_argument("--warmup", type=float, default=15.0, help="auditor start before drain")
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
