"""`bench/dispatch.py --cluster`: dispatch throughput and lag on a 3-primary Redis Cluster.

Each part runs once per scheduler count of `--schedulers` (default 1 and 3), each on a
fresh Cluster (timewheel.testing.redis_cluster: 3 primaries, no replicas, free loopback
ports, AOF appendfsync always). The schedulers are separate processes, each a fenced
node (`--node`) that claims its rendezvous share of the 64 shards by lease, as
`timewheel scheduler` nodes do.

a. throughput: as on one Redis (N runs already due, loaded through one raw pipe per
   primary, promoted apart), then the scheduler processes, each already in the lease
   membership, are started together (SIGUSR1); the figure is N over the time from that
   start until the last of them dispatched its last run (each notes the wall time of its
   last dispatch; the bench polls the streams only to know when all N are there).
b. lag: the scheduler processes run and share the shards first; then the load
   generator creates at a steady rate (each create sent to its shard's primary), each
   task due 1 s after its create; lag and exactly-once as on one Redis.

For every part, per primary: the shards it serves, the runs dispatched from it, its
main-thread CPU (INFO cpu) and its FCALL time (INFO commandstats) over the timed phase;
per scheduler process: the shards it held, its runs, its CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import signal
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from dispatch import (
    MAIN_THREAD_CPU,
    PAYLOAD_BYTES,
    SHARDS,
    TENANTS,
    count_stream_entries,
    host_gauge,
    info_section,
    lag_figures,
    latency_latest,
    load_scripts,
    payload_json,
    promote_all,
    read_dispatches,
    result_line,
    server_ms,
    settings_for,
    spawn,
    stat_usec,
    stop_process,
    tenant_names,
    wait_for_line,
    wait_for_rewrite,
    wait_process,
)
from rawpipe import ClusterPipes, create_commands_keyed
from redis.asyncio.cluster import RedisCluster

from timewheel.engine import Engine
from timewheel.tasks.model import NewTask
from timewheel.testing.redis_cluster import RedisClusterServers

PRIMARIES = 3


class Primaries:
    """A plain client per primary: INFO and the streams of each node, read one by one."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.clients = [aioredis.Redis.from_url(u) for u in urls]

    def address(self, i: int) -> str:
        return self.urls[i].removeprefix("redis://")

    async def each(self, section: str) -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(info_section(c, section) for c in self.clients)))

    async def reset_stats(self) -> None:
        await asyncio.gather(*(c.config_resetstat() for c in self.clients))

    async def stream_entries(self) -> list[int]:
        return list(await asyncio.gather(*(count_stream_entries(c) for c in self.clients)))

    async def close(self) -> None:
        for client in self.clients:
            await client.aclose()


def shard_primaries(engine: Engine, primaries: Primaries) -> list[int]:
    """For each shard, the index of the primary serving its hash tag."""
    client = engine.client
    if not isinstance(client, RedisCluster):
        raise RuntimeError("the --cluster bench needs a Cluster client")
    index = {p.removeprefix("redis://"): i for i, p in enumerate(primaries.urls)}
    out = []
    for shard in range(SHARDS):
        node = client.get_node_from_key(engine.keys.meta(shard))
        if node is None:
            raise RuntimeError(f"no primary serves shard {shard}")
        out.append(index[f"{node.host}:{node.port}"])
    return out


async def lease_holders(engine: Engine) -> list[str | None]:
    raw: list[Any] = await asyncio.gather(
        *(engine.client.get(engine.keys.lease(s)) for s in range(SHARDS))
    )
    return [None if r is None else bytes(r).decode().rsplit("/", 1)[0] for r in raw]


async def wait_shared(engine: Engine, nodes: list[str], timeout_s: float) -> list[str | None]:
    """Wait until every shard has a holder and every node holds some."""
    deadline = time.monotonic() + timeout_s
    while True:
        held = await lease_holders(engine)
        if None not in held and set(held) == set(nodes):
            return held
        if time.monotonic() > deadline:
            raise TimeoutError(f"the nodes did not share the shards in {timeout_s} s: {held}")
        await asyncio.sleep(0.05)


def per_primary(
    primaries: Primaries,
    owner: list[int],
    cpu0: list[dict[str, Any]],
    cpu1: list[dict[str, Any]],
    stats: list[dict[str, Any]],
    runs: list[int],
    seconds: float,
    run_seconds: float,
) -> list[dict[str, Any]]:
    """What each primary served (its runs over `run_seconds`) and spent over the stats
    window (`seconds`: from the stats' reset to their read)."""
    out = []
    for i in range(len(primaries.urls)):
        cpu_s = sum(float(cpu1[i][k]) - float(cpu0[i][k]) for k in MAIN_THREAD_CPU)
        calls, usec = stat_usec(stats[i], "fcall")
        out.append(
            {
                "address": primaries.address(i),
                "shards": sum(1 for o in owner if o == i),
                "runs": runs[i],
                "runs_per_s": round(runs[i] / run_seconds) if run_seconds > 0 else None,
                "main_thread_cpu_s": round(cpu_s, 2),
                "main_thread_busy": round(cpu_s / seconds, 3) if seconds > 0 else None,
                "main_thread_cpu_us_per_run": round(cpu_s * 1e6 / max(runs[i], 1), 2),
                "fcall_calls": calls,
                "fcall_s": round(usec / 1e6, 3),
                "fcall_us_per_run": round(usec / max(runs[i], 1), 2),
            }
        )
    return out


def scheduler_rows(
    results: list[dict[str, Any] | None], owner: list[int]
) -> list[dict[str, Any] | None]:
    rows: list[dict[str, Any] | None] = []
    for r in results:
        if r is None:
            rows.append(None)
            continue
        held = r.get("shards_held", [])
        rows.append(
            {
                **r,
                "shards": len(held),
                "shards_per_primary": sorted(Counter(owner[s] for s in held).items()),
            }
        )
    return rows


def start_schedulers(
    url: str, count: int, work: Path, max_seconds: float, wait_go: bool
) -> dict[str, tuple[subprocess.Popen[bytes], Path]]:
    procs = {}
    for i in range(1, count + 1):
        node = f"n{i}"
        log = work / f"scheduler-{node}.log"
        args = ["_schedule", "--url", url, "--node", node, "--max-seconds", str(max_seconds)]
        procs[node] = (spawn([*args, *(["--wait-go"] if wait_go else [])], log), log)
    return procs


# -- a. throughput -------------------------------------------------------------------


async def load_due_cluster(engine: Engine, url: str, runs: int, batch: int) -> float:
    """`runs` tasks due in the last minute, each create sent to its shard's primary."""
    probe = aioredis.Redis.from_url(url)
    try:
        now = await server_ms(probe)
    finally:
        await probe.aclose()
    tenants = tenant_names()

    def batches() -> Iterator[list[tuple[str, bytes]]]:
        for start in range(0, runs, batch):
            news = [
                NewTask(
                    tenant=tenants[i % TENANTS],
                    payload_json=payload_json(i),
                    run_at_ms=now - 1_000 - (i * 7919) % 60_000,
                )
                for i in range(start, min(start + batch, runs))
            ]
            yield create_commands_keyed(engine, news)[0]

    started = time.perf_counter()
    pipes = await ClusterPipes.open(url)
    try:
        await pipes.run(batches())
    finally:
        await pipes.close()
    return time.perf_counter() - started


async def cluster_throughput(
    urls: list[str], schedulers: int, args: argparse.Namespace, work: Path
) -> dict[str, Any]:
    runs = args.runs
    engine = await Engine.connect(settings_for(urls[0]))
    primaries = Primaries(urls)
    procs: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    try:
        await load_scripts(engine)
        owner = shard_primaries(engine, primaries)
        load_s = await load_due_cluster(engine, urls[0], runs, args.batch)
        print(f"  throughput x{schedulers}: loaded {runs:,} due runs in {load_s:.1f} s", flush=True)
        deadline = time.monotonic() + args.timeout
        for client in primaries.clients:
            await wait_for_rewrite(client, deadline)
        promote_s, moved, _ = await promote_all(engine, deadline)
        print(f"  throughput x{schedulers}: promoted {moved:,} in {promote_s:.2f} s", flush=True)
        for client in primaries.clients:
            await wait_for_rewrite(client, deadline)
        procs = start_schedulers(urls[0], schedulers, work, args.timeout, wait_go=True)
        for proc, log in procs.values():
            await wait_for_line(log, "READY", proc, 30)
        await asyncio.sleep(0.6)  # two heartbeats each: every node is in the membership
        await primaries.reset_stats()
        cpu0 = await primaries.each("cpu")
        persistence0 = await primaries.each("persistence")
        go_wall = time.time()
        for proc, _ in procs.values():
            proc.send_signal(signal.SIGUSR1)
        streams = sum(await primaries.stream_entries())
        while streams < runs and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            streams = sum(await primaries.stream_entries())
        waited_s = time.time() - go_wall
        cpu1 = await primaries.each("cpu")
        stats = await primaries.each("commandstats")
        persistence1 = await primaries.each("persistence")
        for proc, _ in procs.values():
            stop_process(proc)
        results = [result_line(log) for _, log in procs.values()]
        last = max((r.get("last_dispatch_wall", 0.0) for r in results if r), default=0.0)
        elapsed = last - go_wall if last else waited_s
        per_node_runs = await primaries.stream_entries()
        return {
            "schedulers": schedulers,
            "runs": runs,
            "stream_entries": sum(per_node_runs),
            "complete": sum(per_node_runs) >= runs,
            "seconds": round(elapsed, 3),
            "stats_window_s": round(waited_s, 2),
            "per_s": round(sum(per_node_runs) / elapsed) if elapsed > 0 else None,
            "load_seconds": round(load_s, 2),
            "load_per_s": round(runs / load_s),
            "promote_seconds": round(promote_s, 3),
            "promoted": moved,
            "per_primary": per_primary(
                primaries, owner, cpu0, cpu1, stats, per_node_runs, waited_s, elapsed
            ),
            "per_scheduler": scheduler_rows(results, owner),
            "aof_rewrites_during": [
                int(b.get("aof_rewrites", 0)) - int(a.get("aof_rewrites", 0))
                for a, b in zip(persistence0, persistence1, strict=True)
            ],
            "latency_latest": [await latency_latest(c) for c in primaries.clients],
        }
    finally:
        for proc, _ in procs.values():
            stop_process(proc)
        await primaries.close()
        await engine.close()


# -- b. lag --------------------------------------------------------------------------


async def cluster_lag(
    urls: list[str], schedulers: int, args: argparse.Namespace, work: Path
) -> dict[str, Any]:
    engine = await Engine.connect(settings_for(urls[0]))
    primaries = Primaries(urls)
    ids_path = work / "created.ids"
    load_log = work / "load.log"
    procs: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    load: subprocess.Popen[bytes] | None = None
    try:
        await load_scripts(engine)
        owner = shard_primaries(engine, primaries)
        procs = start_schedulers(urls[0], schedulers, work, args.seconds + 120, wait_go=False)
        for proc, log in procs.values():
            await wait_for_line(log, "READY", proc, 30)
        held = await wait_shared(engine, list(procs), 20)
        await asyncio.sleep(0.5)
        await primaries.reset_stats()
        cpu0 = await primaries.each("cpu")
        cpu0_at = time.perf_counter()
        load = spawn(
            [
                "_load", "--url", urls[0], "--rate", str(args.rate), "--seconds", str(args.seconds),
                "--interval-ms", str(args.interval_ms), "--ids", str(ids_path), "--cluster",
            ],
            load_log,
        )  # fmt: skip
        code = await wait_process(load, args.seconds + 60)
        load_result = result_line(load_log)
        if code != 0 or load_result is None:
            raise RuntimeError(f"load generator failed ({code}): {load_log.read_text()[-2000:]}")
        created_ids = ids_path.read_text().split()
        deadline = time.monotonic() + 30
        while sum(await primaries.stream_entries()) < len(created_ids):
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.25)
        await asyncio.sleep(0.5)  # anything dispatched twice would show up by now
        cpu1 = await primaries.each("cpu")
        window_s = time.perf_counter() - cpu0_at
        stats = await primaries.each("commandstats")
        for proc, _ in procs.values():
            stop_process(proc)
        dispatches = [d for c in primaries.clients for d in await read_dispatches(c)]
        per_node_runs = await primaries.stream_entries()
        figures = lag_figures(created_ids, dispatches)
        by_node = Counter(held)
        figures.update(
            {
                "schedulers": schedulers,
                "load": load_result,
                "stream_entries": sum(per_node_runs),
                "stats_window_s": round(window_s, 2),
                "per_primary": per_primary(
                    primaries, owner, cpu0, cpu1, stats, per_node_runs, window_s, window_s
                ),
                "per_scheduler": [
                    {
                        **(result_line(log) or {}),
                        "shards": by_node[node],
                        "shards_per_primary": sorted(
                            Counter(owner[s] for s, h in enumerate(held) if h == node).items()
                        ),
                    }
                    for node, (_, log) in procs.items()
                ],
                "latency_latest": [await latency_latest(c) for c in primaries.clients],
            }
        )
        return figures
    finally:
        if load is not None:
            stop_process(load)
        for proc, _ in procs.values():
            stop_process(proc)
        await primaries.close()
        await engine.close()


# -- main ----------------------------------------------------------------------------


def on_fresh_cluster(
    name: str, root: Path, args: argparse.Namespace, schedulers: int
) -> dict[str, Any]:
    cluster = RedisClusterServers(
        root / name,
        primaries=PRIMARIES,
        appendfsync=args.appendfsync,
        extra_config={"latency-monitor-threshold": "20"},
    )
    work = root / f"{name}-work"
    work.mkdir(parents=True, exist_ok=True)
    try:
        cluster.start()
        urls = [s.url for s in cluster.servers]
        gauge = asyncio.run(host_gauge(urls[0]))
        print(f"  {name}: host gauge {gauge}", flush=True)
        part = cluster_throughput if name.startswith("throughput") else cluster_lag
        result = asyncio.run(asyncio.wait_for(part(urls, schedulers, args, work), args.timeout))
        result["host_gauge"] = gauge
        return result
    finally:
        cluster.stop()
        shutil.rmtree(root / name, ignore_errors=True)


def primaries_text(rows: list[dict[str, Any]]) -> str:
    return "; ".join(
        f"{r['shards']} shards {r['runs']:,} runs CPU {r['main_thread_cpu_s']} s "
        f"({r['main_thread_cpu_us_per_run']} us/run, FCALL {r['fcall_us_per_run']} us/run)"
        for r in rows
    )


def throughput_summary(r: dict[str, Any]) -> str:
    return (
        f"SUMMARY cluster dispatch throughput, {r['schedulers']} scheduler process(es): "
        f"{r['stream_entries']:,} of {r['runs']:,} due runs in {r['seconds']:.2f} s = "
        f"{r['per_s']:,}/s; per primary: {primaries_text(r['per_primary'])}"
    )


def lag_summary(r: dict[str, Any], args: argparse.Namespace) -> str:
    return (
        f"SUMMARY cluster dispatch lag, {r['schedulers']} scheduler process(es), "
        f"{args.rate:,}/s offered for {args.seconds:g} s (achieved "
        f"{r['load']['achieved_per_s']:,}/s): p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, "
        f"max {r['max_ms']} ms over {r['count']:,}; duplicates {r['duplicates']}, missing "
        f"{r['missing']}; per primary: {primaries_text(r['per_primary'])}"
    )


def cluster_main(args: argparse.Namespace) -> int:
    root = args.data_dir or Path(tempfile.mkdtemp(prefix="tw-bench-dispatch-cluster-"))
    parts = args.parts.split(",")
    print(
        f"dispatch bench on a {PRIMARIES}-primary Redis Cluster (each part on a fresh one), "
        f"AOF appendfsync {args.appendfsync}; {SHARDS} shards, {TENANTS} tenants, "
        f"{PAYLOAD_BYTES} B payload; scheduler processes: {args.schedulers}",
        flush=True,
    )
    results: dict[str, Any] = {}
    started = time.perf_counter()
    try:
        for part in ("throughput", "lag"):
            if part not in parts:
                continue
            for count in args.scheduler_counts:
                name = f"{part}-{count}"
                results[name] = on_fresh_cluster(name, root, args, count)
                if part == "throughput":
                    print(throughput_summary(results[name]), flush=True)
                else:
                    print(lag_summary(results[name], args), flush=True)
    finally:
        if args.data_dir is None:
            with contextlib.suppress(OSError):
                shutil.rmtree(root, ignore_errors=True)
    out = {
        "parameters": {
            "primaries": PRIMARIES,
            "replicas": 0,
            "schedulers": args.scheduler_counts,
            "runs": args.runs,
            "rate_per_s": args.rate,
            "seconds": args.seconds,
            "interval_ms": args.interval_ms,
            "delay_ms": 1000,
            "payload_bytes": PAYLOAD_BYTES,
            "shards": SHARDS,
            "tenants": TENANTS,
            "appendfsync": args.appendfsync,
            "machine": "2 cores shared by the 3 redis-servers, the schedulers and the load",
            "bench_seconds": round(time.perf_counter() - started, 1),
        },
        **results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0
