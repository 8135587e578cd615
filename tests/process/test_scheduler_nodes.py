"""Several `timewheel scheduler` processes: shares, exactly-once, kill -9, SIGSTOP, SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from timewheel.config import Settings
from timewheel.engine import Engine
from timewheel.store.server import find_free_port
from timewheel.tasks.model import NewTask
from timewheel.testing.dispatch import all_deliveries
from timewheel.testing.nodes import Fleet, NodeProcess
from timewheel.testing.settings import test_settings

TTL_MS = 2000


def now_ms() -> int:
    return int(time.time() * 1000)


async def wait_until(check: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> float:
    """Poll until check() is true; returns the seconds it took."""
    start = time.monotonic()
    while not await check():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.02)
    return time.monotonic() - start


async def owners(engine: Engine) -> dict[int, tuple[str, int] | None]:
    """Each shard's lease holder as (node, epoch), or None."""
    out: dict[int, tuple[str, int] | None] = {}
    for shard in range(engine.settings.shards):
        raw: Any = await engine.client.get(engine.keys.lease(shard))
        if raw is None:
            out[shard] = None
        else:
            node, epoch = raw.decode().rsplit("/", 1)
            out[shard] = (node, int(epoch))
    return out


async def balanced(engine: Engine, nodes: set[str]) -> bool:
    held = await owners(engine)
    holders = {h[0] for h in held.values() if h is not None}
    return None not in held.values() and holders == nodes


@dataclass(frozen=True)
class DispatchEvent:
    shard: int
    node: str
    epoch: int
    at_ms: int
    runs: int


async def dispatch_events(engine: Engine) -> list[DispatchEvent]:
    out = []
    for shard in range(engine.settings.shards):
        entries: Any = await engine.client.xrange(engine.keys.events(shard))
        for _, fields in entries:
            if fields[b"e"] == b"dispatched":
                out.append(
                    DispatchEvent(
                        shard,
                        fields[b"node"].decode(),
                        int(fields[b"epoch"]),
                        int(fields[b"at"]),
                        len(fields[b"runs"].split(b",")),
                    )
                )
    return out


def tenants_for(engine: Engine, shards: set[int], per_shard: int = 1) -> list[str]:
    """Tenant names whose tasks land in the given shards."""
    found: dict[int, list[str]] = {s: [] for s in shards}
    i = 0
    while any(len(v) < per_shard for v in found.values()):
        name = f"tn{i}"
        shard = engine.store.shards_of(name)[0]
        if shard in found and len(found[shard]) < per_shard:
            found[shard].append(name)
        i += 1
    return [n for names in found.values() for n in names]


async def connect(settings: Settings) -> Engine:
    return await Engine.connect(settings)


async def test_three_nodes_dispatch_30000_runs_exactly_once_and_on_time(
    standalone_url: str, tmp_path: Path
) -> None:
    settings = test_settings(standalone_url, shards=16)
    engine = await connect(settings)
    try:
        with Fleet(settings, tmp_path, ["n1", "n2", "n3"], ttl_ms=TTL_MS):
            await wait_until(lambda: balanced(engine, {"n1", "n2", "n3"}), 15, "3-way shares")
            tenants = [f"tenant{i}" for i in range(50)]
            start = now_ms() + 5000
            created = []
            for second in range(10):  # 3,000 runs due in each of 10 seconds
                base = start + second * 1000
                chunk = [
                    NewTask(
                        tenant=tenants[i % 50], payload_json=str(i), run_at_ms=base + (i * 7) % 1000
                    )
                    for i in range(3000)
                ]
                created.extend(await engine.tasks.create_many(chunk))
                assert now_ms() < base, "creating fell behind the due times"
            ids = {c.task_id for c in created}
            assert len(ids) == 30_000

            async def all_out() -> bool:
                return len(await all_deliveries(engine)) >= 30_000

            await wait_until(all_out, 25, "30,000 dispatches")
            await asyncio.sleep(0.5)  # room for a duplicate to show up
        deliveries = await all_deliveries(engine)
        counts = Counter(d.run_id for d in deliveries)
        assert set(counts) == ids and max(counts.values()) == 1
        late = sorted(d.dispatched_ms - d.due_ms for d in deliveries)
        assert late[0] >= 0 and late[-1] < 1000, f"max lag {late[-1]} ms"
        by_node: Counter[str] = Counter()
        for event in await dispatch_events(engine):
            by_node[event.node] += event.runs
        assert set(by_node) == {"n1", "n2", "n3"}, by_node
    finally:
        await engine.close()


async def test_kill_9_of_a_node_loses_nothing_and_others_resume_within_ttl(
    redis_url: str, tmp_path: Path
) -> None:
    settings = test_settings(redis_url, shards=16)
    engine = await connect(settings)
    try:
        with Fleet(settings, tmp_path, ["k1", "k2", "k3"], ttl_ms=TTL_MS) as fleet:
            await wait_until(lambda: balanced(engine, {"k1", "k2", "k3"}), 15, "3-way shares")
            tenants = tenants_for(engine, set(range(16)))
            created = []
            killed_at = 0
            begin = time.monotonic()
            step = 0
            while time.monotonic() - begin < 8:  # 400 runs/s, each due 1 s after create
                batch = [
                    NewTask(tenant=tenants[(step * 40 + i) % len(tenants)], delay_ms=1000)
                    for i in range(40)
                ]
                created.extend(await engine.tasks.create_many(batch))
                step += 1
                if not killed_at and time.monotonic() - begin > 3:
                    fleet["k2"].signal(signal.SIGKILL)
                    killed_at = now_ms()
                await asyncio.sleep(0.1)
            assert killed_at
            ids = {c.task_id for c in created}

            async def all_out() -> bool:
                return len(await all_deliveries(engine)) >= len(ids)

            await wait_until(all_out, 15, "every run dispatched")
            assert await balanced(engine, {"k1", "k3"})
        deliveries = await all_deliveries(engine)
        counts = Counter(d.run_id for d in deliveries)
        assert set(counts) == ids and max(counts.values()) == 1
        after = [d.dispatched_ms - d.due_ms for d in deliveries if d.due_ms >= killed_at]
        assert after and max(after) <= TTL_MS + 1000, f"max lag after kill {max(after)} ms"
    finally:
        await engine.close()


async def test_a_frozen_node_is_fenced_out_of_the_shards_it_lost(
    standalone_url: str, tmp_path: Path
) -> None:
    """fa knows runs come due at T in its shards, freezes past its ttl, wakes after T.

    fb took fa's shards meanwhile and is frozen itself, so when fa wakes its own loop
    ticks those shards at once with its old epochs. Only the epoch check in the scripts
    keeps it from dispatching there; with it, the runs wait for a current lease holder.
    """
    settings = test_settings(standalone_url, shards=8)
    engine = await connect(settings)
    ttl = 1000
    try:
        with Fleet(settings, tmp_path, ["fa", "fb"], ttl_ms=ttl) as fleet:
            await wait_until(lambda: balanced(engine, {"fa", "fb"}), 15, "2-way shares")
            before = await owners(engine)
            lost = {s: h[1] for s, h in before.items() if h is not None and h[0] == "fa"}
            assert lost
            due = now_ms() + 4000
            tenants = tenants_for(engine, set(lost))
            created = await engine.tasks.create_many(
                [NewTask(tenant=t, run_at_ms=due) for t in tenants for _ in range(20)]
            )
            await asyncio.sleep(0.3)  # fa learns (wake-up, tick) that its shards are due at T
            fleet["fa"].signal(signal.SIGSTOP)

            async def fb_has_all() -> bool:
                held = await owners(engine)
                return all(h is not None and h[0] == "fb" for h in held.values())

            await wait_until(fb_has_all, 3, "fb to take fa's shards")
            fleet["fb"].signal(signal.SIGSTOP)
            assert now_ms() < due - 200, "the takeover ran into the due time"
            await asyncio.sleep((due - now_ms() + 300) / 1000)
            resumed_at = now_ms()
            fleet["fa"].signal(signal.SIGCONT)
            await asyncio.sleep(0.5)
            fleet["fb"].signal(signal.SIGCONT)

            async def all_out() -> bool:
                return len(await all_deliveries(engine)) >= len(created)

            await wait_until(all_out, 10, "the runs to be dispatched by a lease holder")
            assert "lease_lost" in fleet["fa"].log()
        stale = [
            e
            for e in await dispatch_events(engine)
            if e.node == "fa"
            and e.shard in lost
            and e.epoch <= lost[e.shard]
            and e.at_ms >= resumed_at
        ]
        assert not stale, f"fa dispatched under a lost epoch: {stale}"
        counts = Counter(d.run_id for d in await all_deliveries(engine))
        assert set(counts) == {c.task_id for c in created} and max(counts.values()) == 1
    finally:
        await engine.close()


async def test_sigterm_releases_leases_at_once_and_exits_0(redis_url: str, tmp_path: Path) -> None:
    settings = test_settings(redis_url, shards=16)
    engine = await connect(settings)
    try:
        with Fleet(settings, tmp_path, ["t1", "t2"], ttl_ms=TTL_MS) as fleet:
            await wait_until(lambda: balanced(engine, {"t1", "t2"}), 15, "2-way shares")
            fleet["t1"].signal(signal.SIGTERM)
            code = fleet["t1"].proc.wait(timeout=10)
            # Released, not left to expire: the moment t1 has exited no lease names it
            # (a lease it had dropped would still name it for most of a ttl).
            left = {s for s, h in (await owners(engine)).items() if h and h[0] == "t1"}
            assert left == set(), f"t1 still holds shards {sorted(left)} after exiting"
            await wait_until(lambda: balanced(engine, {"t2"}), 5, "t2 to hold all")
            assert code == 0, fleet["t1"].log()
            assert "shutdown" in fleet["t1"].log()
    finally:
        await engine.close()


async def test_a_node_serves_prometheus_metrics(standalone_url: str, tmp_path: Path) -> None:
    settings = test_settings(standalone_url, shards=4)
    engine = await connect(settings)
    port = find_free_port()
    node = NodeProcess(settings, "m1", tmp_path, ttl_ms=TTL_MS, metrics_port=port)
    try:
        node.wait_started()
        await wait_until(lambda: balanced(engine, {"m1"}), 10, "m1 to hold every shard")
        await engine.tasks.create_many([NewTask(tenant="metered", delay_ms=0) for _ in range(25)])

        async def counted() -> bool:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
            return 'timewheel_dispatched_runs_total{tenant="metered"} 25.0' in text

        await wait_until(counted, 10, "the dispatch counter")
        text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        for name in (
            "timewheel_dispatch_lag_seconds_bucket",
            "timewheel_due_backlog",
            "timewheel_tick_duration_seconds_count",
            "timewheel_lease_acquisitions_total 4.0",
            "timewheel_owned_shards 4.0",
        ):
            assert name in text, name
        assert "timewheel_dispatch_lag_seconds_count 25.0" in text
        # One log line per lease change, none per run at info level.
        assert node.log().count("lease_acquired") == 4
        assert "metered" not in node.log()
    finally:
        assert node.stop() == 0
        await engine.close()
