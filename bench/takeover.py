"""The scale bench's takeover part: a replica of the loaded server and three sentinels,
then kill -9 of the primary under a scheduler and a steady create load, timed until the
promoted replica dispatches again.

1. A replica (the shipped settings, its own dir) does a full sync from the primary,
   timed from its start until its link is up and its offset equals the primary's (with
   the primary's repl-diskless-sync-delay, Redis' default 5 s, recorded beside it).
2. Three sentinels monitor the primary (down-after-milliseconds and failover-timeout
   as given); a `timewheel scheduler` process runs on the redis+sentinel:// URL.
3. Creates at `rate`/s through the Sentinel URL (Engine.tasks.create_many every 10 ms,
   each run due `delay_ms` after its first try; a failed batch is sent again with the
   same idempotency keys), `before_s` seconds, then kill -9 of the primary, and `after_s`
   seconds more.
4. Figures: seconds from the kill until a sentinel names the replica (+switch-master)
   and until all three do; until creates are acknowledged again; until the first run
   due after the kill is dispatched on the new primary; the lag of runs due in the 10 s
   after the kill (p50/p99/max); and every run acknowledged (before the kill and after)
   looked up in the new primary's ready streams: missing ones are counted.

The promoted replica is the bench's server afterwards (the caller swaps it in).
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from common import percentile, scheduler_process
from dispatch import read_dispatches, stop_process
from memory import SHARDS, payload_json, tenant_names

from timewheel.config import Settings
from timewheel.engine import Engine
from timewheel.errors import RedisUnavailable
from timewheel.store.server import RedisServer
from timewheel.tasks.model import NewTask
from timewheel.testing.sentinel import (
    SentinelServer,
    replica_in_sync,
    sentinel_url,
    start_sentinels,
)

WINDOW_S = 10.0
"""The lag figures cover runs due in this many seconds after the kill."""
TICK_S = 0.01
TENANTS = 100


@dataclass(frozen=True, slots=True)
class TakeoverPlan:
    rate: int = 300
    before_s: float = 10.0
    after_s: float = 20.0
    delay_ms: int = 1000
    down_after_ms: int = 1000
    failover_timeout_ms: int = 5000
    sync_timeout_s: float = 600.0
    settle_timeout_s: float = 120.0


@dataclass(slots=True)
class Load:
    """The creates sent: acknowledged ones, and what failed meanwhile."""

    acked: dict[str, tuple[str, int, float]] = field(default_factory=dict)
    """idempotency key -> (run id, due ms, monotonic time of the acknowledgement)"""
    failed_batches: int = 0
    errors: dict[str, int] = field(default_factory=dict)


async def full_sync(primary: RedisServer, replica: RedisServer, timeout_s: float) -> float:
    """Start `replica` (replicaof `primary`) and wait until it is in sync; seconds."""
    started = time.perf_counter()
    await asyncio.to_thread(replica.start, timeout_s)
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(replica_in_sync, replica, primary):
        if time.monotonic() >= deadline:
            raise TimeoutError(f"the replica was not in sync within {timeout_s:.0f} s")
        await asyncio.sleep(0.1)
    return time.perf_counter() - started


async def create_load(
    engine: Engine, plan: TakeoverPlan, load: Load, stop: asyncio.Event, seconds: float
) -> None:
    """Creates at plan.rate/s until `stop` (or `seconds`); a failed batch is kept and sent
    again, with the same keys and due times, with the next ones."""
    tenants = tenant_names(TENANTS)
    pending: list[NewTask] = []
    started = time.monotonic()
    made = 0
    while not stop.is_set() and time.monotonic() - started < seconds:
        due = int((time.monotonic() - started) * plan.rate)
        now_ms = int(time.time() * 1000)
        for i in range(made, due):
            pending.append(
                NewTask(
                    tenant=tenants[i % TENANTS],
                    payload_json=payload_json(i),
                    run_at_ms=now_ms + plan.delay_ms,
                    idempotency_key=f"takeover-{i}",
                )
            )
        made = max(made, due)
        if pending:
            batch = pending[:500]
            try:
                results = await engine.tasks.create_many(batch)
            except RedisUnavailable as exc:
                load.failed_batches += 1
                kind = type(exc.__cause__ or exc).__name__
                load.errors[kind] = load.errors.get(kind, 0) + 1
                await asyncio.sleep(0.1)
                continue
            answered = time.monotonic()
            for new, result in zip(batch, results, strict=True):
                assert new.idempotency_key is not None and new.run_at_ms is not None
                load.acked[new.idempotency_key] = (result.task_id, new.run_at_ms, answered)
            del pending[: len(batch)]
        await asyncio.sleep(TICK_S)


async def watch_switch(
    sentinels: list[SentinelServer], old: tuple[str, int], killed: float, timeout_s: float
) -> dict[str, float | None]:
    """Seconds from `killed` (monotonic) until a first sentinel, then all, name a
    primary other than `old`."""
    clients = [aioredis.Redis(host=s.host, port=s.port, socket_timeout=1) for s in sentinels]
    first: float | None = None
    try:
        deadline = killed + timeout_s
        while time.monotonic() < deadline:
            named = []
            for client, s in zip(clients, sentinels, strict=True):
                try:
                    reply = await client.execute_command(  # type: ignore[no-untyped-call]
                        "SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.service
                    )
                    named.append((reply[0].decode(), int(reply[1])) if reply else None)
                except (OSError, aioredis.RedisError):
                    named.append(None)
            moved = [a for a in named if a is not None and a != old]
            if moved and first is None:
                first = time.monotonic() - killed
            if len(moved) == len(sentinels):
                return {"first_sentinel_s": first, "all_sentinels_s": time.monotonic() - killed}
            await asyncio.sleep(0.02)
    finally:
        for client in clients:
            await client.aclose()
    return {"first_sentinel_s": first, "all_sentinels_s": None}


async def run_takeover(
    primary: RedisServer, replica: RedisServer, root: Path, plan: TakeoverPlan
) -> dict[str, Any]:
    """The part's steps (module doc) on a running `primary`, with `replica` described
    (not started, replicaof the primary). The primary is dead at the end; the replica is
    the primary then, running, and the caller's to stop."""
    pclient = aioredis.Redis(host=primary.host, port=primary.port, socket_timeout=60)
    try:
        sync_config = {
            name: str((await pclient.config_get(name)).get(name))
            for name in ("repl-diskless-sync", "repl-diskless-sync-delay")
        }
    finally:
        await pclient.aclose()
    sync_s = await full_sync(primary, replica, plan.sync_timeout_s)
    rclient = aioredis.Redis(host=replica.host, port=replica.port, socket_timeout=60)
    sentinels: list[SentinelServer] = []
    sched: subprocess.Popen[bytes] | None = None
    engine: Engine | None = None
    try:
        # The seconds include the primary's wait for more replicas before a diskless
        # sync starts (repl-diskless-sync-delay, Redis' default 5 s).
        synced = {"seconds": round(sync_s, 2), **sync_config}
        old = (primary.host, primary.port)
        sentinels = await asyncio.to_thread(
            start_sentinels,
            root / "sentinels",
            old,
            down_after_ms=plan.down_after_ms,
            failover_timeout_ms=plan.failover_timeout_ms,
        )
        url = sentinel_url(sentinels)
        settings = Settings(redis_url=url, shards=SHARDS)
        sched_log = root / "takeover-scheduler.log"
        sched = scheduler_process(settings, "takeover", sched_log)
        deadline = time.monotonic() + 60
        while "scheduler_started" not in sched_log.read_text(errors="replace"):
            if sched.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the scheduler did not start: {sched_log.read_text()[-2000:]}")
            await asyncio.sleep(0.1)
        engine = await Engine.connect(settings)
        load, stop = Load(), asyncio.Event()
        creating = asyncio.create_task(
            create_load(engine, plan, load, stop, plan.before_s + plan.after_s + 600)
        )
        await asyncio.sleep(plan.before_s)
        acked_before = set(load.acked)
        kill_ms, killed = int(time.time() * 1000), time.monotonic()
        await asyncio.to_thread(primary.kill)
        switch = await watch_switch(sentinels, old, killed, plan.settle_timeout_s)
        await asyncio.sleep(max(0.0, plan.after_s - (time.monotonic() - killed)))
        stop.set()
        await asyncio.wait_for(creating, plan.settle_timeout_s)
        figures = await settle(rclient, load, acked_before, kill_ms, killed, plan)
        return {
            "full_sync": synced,
            "sentinel": {
                "down_after_ms": plan.down_after_ms,
                "failover_timeout_ms": plan.failover_timeout_ms,
                **{k: None if v is None else round(v, 2) for k, v in switch.items()},
            },
            "failed_create_batches": load.failed_batches,
            "create_errors": load.errors,
            "scheduler_log_warnings": _warnings(sched_log),
            **figures,
        }
    finally:
        if engine is not None:
            await engine.close()
        if sched is not None:
            stop_process(sched)
        for s in sentinels:
            s.kill()
        await rclient.aclose()


async def settle(
    client: aioredis.Redis,
    load: Load,
    acked_before: set[str],
    kill_ms: int,
    killed: float,
    plan: TakeoverPlan,
) -> dict[str, Any]:
    """Wait (bounded) until every acknowledged run is in a ready stream of the new
    primary (`client`); the figures."""
    wanted = {run_id for run_id, _, _ in load.acked.values()}
    deadline = time.monotonic() + plan.settle_timeout_s
    while True:
        dispatches = [d for d in await read_dispatches(client) if d[0] in wanted]
        seen = {d[0] for d in dispatches}
        if wanted <= seen or time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.5)
    after_kill = [d for d in dispatches if d[1] >= kill_ms]
    first = min(after_kill, key=lambda d: (d[1], d[2]), default=None)
    window = sorted(d[2] - d[1] for d in after_kill if d[1] < kill_ms + WINDOW_S * 1000)
    ack_again = [t for k, (_, _, t) in load.acked.items() if k not in acked_before]
    counts: dict[str, int] = {}
    for run_id, _, _ in dispatches:
        counts[run_id] = counts.get(run_id, 0) + 1
    before_runs = {load.acked[k][0] for k in acked_before}
    return {
        "acked_before_kill": len(acked_before),
        "acked_after_kill": len(load.acked) - len(acked_before),
        "creates_acked_again_s": round(min(ack_again) - killed, 2) if ack_again else None,
        "first_due_after_kill_dispatched_s": round((first[2] - kill_ms) / 1000, 2)
        if first
        else None,
        "window_s": WINDOW_S,
        "window_runs": len(window),
        "window_lag_p50_ms": percentile(window, 50),
        "window_lag_p99_ms": percentile(window, 99),
        "window_lag_max_ms": window[-1] if window else None,
        "missing_acked_before_kill": len(before_runs - seen),
        "missing_acked_after_kill": len(wanted - before_runs - seen),
        "duplicates": sum(n - 1 for n in counts.values() if n > 1),
    }


def _warnings(log: Path) -> dict[str, int]:
    """The scheduler's warning events, counted by name."""
    out: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in log.read_text(errors="replace").splitlines():
            if '"level": "warning"' in line and '"event": "' in line:
                name = line.split('"event": "', 1)[1].split('"', 1)[0]
                out[name] = out.get(name, 0) + 1
    return out


def takeover_line(r: dict[str, Any]) -> str:
    if r.get("skipped"):
        return f"SUMMARY scale takeover: skipped ({r['reason']})"
    s = r["sentinel"]
    return (
        f"SUMMARY scale takeover: full sync {r['full_sync']['seconds']:.1f} s (with the "
        f"{r['full_sync']['repl-diskless-sync-delay']} s repl-diskless-sync-delay); after kill -9 "
        f"of the primary a sentinel named the replica in {s['first_sentinel_s']} s (all three "
        f"{s['all_sentinels_s']} s, down-after {s['down_after_ms']} ms), creates acknowledged "
        f"again in {r['creates_acked_again_s']} s, first run due after the kill dispatched "
        f"in {r['first_due_after_kill_dispatched_s']} s; lag of the {r['window_runs']:,} runs "
        f"due in the {r['window_s']:g} s after it p50 {r['window_lag_p50_ms']} ms, p99 "
        f"{r['window_lag_p99_ms']} ms, max {r['window_lag_max_ms']} ms; acknowledged before "
        f"the kill and missing: {r['missing_acked_before_kill']} of "
        f"{r['acked_before_kill']:,} (after: {r['missing_acked_after_kill']} of "
        f"{r['acked_after_kill']:,}), duplicates {r['duplicates']}"
    )
