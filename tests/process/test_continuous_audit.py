"""The continuous auditor on `timewheel scheduler` processes: faults injected into Redis
and into the fleet show up within an audit interval as metrics and in GET /v1/audit; the
auditor lease moves when its node stops; canaries flow, and one held back is a finding;
a clean deployment under load reports nothing; a tenant's key sees its own findings only."""

from __future__ import annotations

import asyncio
import re
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from timewheel.api import create_app
from timewheel.config import Settings
from timewheel.dispatch.leases import rendezvous_owner
from timewheel.engine import Engine
from timewheel.runs.delivery import Delivery
from timewheel.runs.worker import Worker
from timewheel.store.server import find_free_port
from timewheel.tasks.model import NewTask
from timewheel.testing.nodes import NodeProcess
from timewheel.testing.settings import test_settings
from timewheel.types import ms_to_rfc3339

INTERVAL_MS = 1500


def audit_settings(url: str, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "audit_interval_ms": INTERVAL_MS,
        # Passes within the short interval: a deployment keeps to a few per cent of Redis.
        "audit_max_share": 0.5,
        "canary_interval_ms": 500,
        "canary_deadline_ms": 1500,
        "admin_key": "tw_admin_test",
    }
    values.update(overrides)
    return test_settings(url, **values)


async def wait_for(check: Callable[[], Awaitable[Any]], timeout_s: float, what: str) -> Any:
    """Poll until check() gives something truthy; returns it."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = await check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)


def scrape(port: int) -> dict[str, float]:
    """The samples of a node's /metrics as {'name{labels}': value}."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


async def auditor_of(engine: Engine) -> str | None:
    raw: Any = await engine.client.get(engine.keys.auditor_lease())
    return None if raw is None else str(raw.decode()).rpartition("/")[0]


@asynccontextmanager
async def api(engine: Engine) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(engine.settings, engine=engine)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://tw") as client:
        yield client


async def tenant_key(client: httpx.AsyncClient, admin: str, tenant: str) -> str:
    auth = {"authorization": f"Bearer {admin}"}
    r = await client.post("/v1/tenants", json={"id": tenant}, headers=auth)
    assert r.status_code == 201, r.text
    r = await client.post(f"/v1/tenants/{tenant}/keys", headers=auth)
    assert r.status_code == 201, r.text
    key: str = r.json()["key"]
    return key


async def latest(client: httpx.AsyncClient, key: str) -> dict[str, Any] | None:
    r = await client.get("/v1/audit", headers={"authorization": f"Bearer {key}"})
    if r.status_code == 404:
        return None
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


def tenant_on(engine: Engine, shard: int, stem: str) -> str:
    return next(
        f"{stem}{i}" for i in range(10_000) if engine.store.shards_of(f"{stem}{i}")[0] == shard
    )


def node_names(shards: int) -> tuple[str, str]:
    """Two node ids that both own some of the shards."""
    for i in range(1000):
        a, b = f"na{i}", f"nb{i}"
        owners = {rendezvous_owner(s, [a, b]) for s in range(shards)}
        if owners == {a, b}:
            return a, b
    raise AssertionError("no pair of node ids shares the shards")


async def test_injected_faults_show_within_an_interval_and_tenants_see_their_own(
    standalone_url: str, tmp_path: Path
) -> None:
    settings = audit_settings(standalone_url)
    engine = await Engine.connect(settings)
    port = find_free_port()
    node = NodeProcess(settings, "solo", tmp_path, ttl_ms=2000, metrics_port=port)
    try:
        node.wait_started()
        async with api(engine) as client:
            admin = settings.admin_key
            first = await wait_for(lambda: latest(client, admin), 20, "a first pass")
            assert first["counts"] == {}, first
            alpha, beta = tenant_on(engine, 1, "alpha"), tenant_on(engine, 2, "beta")
            key_a = await tenant_key(client, admin, alpha)
            key_b = await tenant_key(client, admin, beta)
            far = int(time.time() * 1000) + 600_000
            a = await engine.tasks.create(NewTask(alpha, run_at_ms=far))
            b = await engine.tasks.create(NewTask(beta, run_at_ms=far))
            k = engine.keys
            # a wheel member gone: the run would never be sent
            bucket = far - far % settings.bucket_ms
            assert await engine.client.hdel(k.bucket(1, bucket), k.bucket_member(a.task_id)) == 1
            # a record gone: its wheel member points at nothing
            assert await engine.client.hdel(*(await engine.store.record_key(b.task_id))) == 1
            injected = time.monotonic()

            async def both_found() -> dict[str, Any] | None:
                doc = await latest(client, admin)
                counts = (doc or {}).get("counts", {})
                return doc if {"not_in_wheel", "record_missing"} <= set(counts) else None

            doc = await wait_for(both_found, 20, "the faults in a pass")
            assert time.monotonic() - injected < 2 * INTERVAL_MS / 1000 + 3
            ids = {(f["kind"], f["id"]) for f in doc["findings"]}
            assert ("not_in_wheel", a.task_id) in ids and ("record_missing", b.task_id) in ids
            assert doc["tenants"][alpha] == {"not_in_wheel": 1}
            samples = scrape(port)
            assert samples['timewheel_audit_findings{kind="not_in_wheel"}'] == 1
            assert samples['timewheel_audit_findings{kind="record_missing"}'] >= 1
            assert samples['timewheel_audit_tenant_findings{tenant="' + alpha + '"}'] == 1
            assert samples["timewheel_audit_last_pass_timestamp_seconds"] > time.time() - 10
            assert samples["timewheel_auditor"] == 1
            assert 'event": "audit_finding"' in node.log() and a.task_id in node.log()

            # a tenant's key: its own findings and counts, nobody else's
            mine = await latest(client, key_a)
            assert mine is not None
            assert mine["counts"] == {"not_in_wheel": 1}
            assert [f["id"] for f in mine["findings"]] == [a.task_id]
            assert "tenants" not in mine
            theirs = await latest(client, key_b)
            assert theirs is not None
            assert all(f["tenant"] == beta for f in theirs["findings"])
            assert a.task_id not in str(theirs)
            r = await client.get("/v1/audit")
            assert r.status_code == 401
    finally:
        node.stop()
        await engine.close()


async def test_the_auditor_lease_moves_when_its_node_stops(
    standalone_url: str, tmp_path: Path
) -> None:
    settings = audit_settings(standalone_url)
    engine = await Engine.connect(settings)
    names = ["m1", "m2"]
    nodes = {n: NodeProcess(settings, n, tmp_path, ttl_ms=1000) for n in names}
    try:
        for n in nodes.values():
            n.wait_started()
        holder = await wait_for(lambda: auditor_of(engine), 10, "an auditor")
        other = next(n for n in names if n != holder)
        async with api(engine) as client:
            doc = await wait_for(lambda: latest(client, settings.admin_key), 20, "a pass")
            assert doc["node"] == holder
            nodes[holder].stop()
            assert 'event": "auditor_lease_dropped"' in nodes[holder].log()

            async def moved() -> bool:
                return await auditor_of(engine) == other

            await wait_for(moved, 10, "the lease on the other node")

            async def by_other() -> dict[str, Any] | None:
                d = await latest(client, settings.admin_key)
                return d if d is not None and d["node"] == other else None

            doc = await wait_for(by_other, 20, "a pass by the other node")
            assert doc["counts"] == {}, doc
    finally:
        for n in nodes.values():
            n.stop()
        await engine.close()


async def test_canaries_flow_and_one_held_back_by_a_stopped_node_is_a_finding(
    standalone_url: str, tmp_path: Path
) -> None:
    settings = audit_settings(standalone_url)
    engine = await Engine.connect(settings)
    keeper, stalled = node_names(settings.shards)
    port = find_free_port()
    # a lease ttl of 4 s: once the second node is stopped, its shards stay held by it,
    # undispatched, for about 4 s before the first node takes them over
    first = NodeProcess(settings, keeper, tmp_path, ttl_ms=4000, metrics_port=port)
    first.wait_started()
    second = NodeProcess(settings, stalled, tmp_path, ttl_ms=4000)
    try:
        second.wait_started()
        assert await wait_for(lambda: auditor_of(engine), 10, "an auditor") == keeper
        held = {
            s for s in range(settings.shards) if rendezvous_owner(s, [keeper, stalled]) == stalled
        }

        async def flowing() -> dict[str, float] | None:
            m = scrape(port)
            acked = [
                m.get(f'timewheel_canary_lag_seconds{{shard="{s}",stage="acked"}}')
                for s in range(settings.shards)
            ]
            missing = [
                m.get(f'timewheel_canary_missing{{shard="{s}"}}') for s in range(settings.shards)
            ]
            if None in acked or missing != [0.0] * settings.shards:
                return None
            lease: Any = await engine.client.get(engine.keys.lease(min(held)))
            return m if lease is not None and lease.decode().startswith(stalled + "/") else None

        m = await wait_for(flowing, 30, "canaries acknowledged on every shard, both nodes in")
        for s in range(settings.shards):
            dispatched = m[f'timewheel_canary_lag_seconds{{shard="{s}",stage="dispatched"}}']
            assert (
                0 <= dispatched <= m[f'timewheel_canary_lag_seconds{{shard="{s}",stage="acked"}}']
            )
        assert not any("~canary" in name for name in m if "tenant=" in name)
        second.signal(signal.SIGSTOP)
        stopped = time.monotonic()

        async def missing() -> dict[str, float] | None:
            got = scrape(port)
            flags = {
                s
                for s in range(settings.shards)
                if got[f'timewheel_canary_missing{{shard="{s}"}}'] == 1
            }
            return got if flags == held else None

        got = await wait_for(missing, 6, "the held-back canaries missing")
        assert time.monotonic() - stopped < 6
        assert got['timewheel_audit_findings{kind="canary_missing"}'] == len(held)
        async with api(engine) as client:

            async def in_a_pass() -> dict[str, Any] | None:
                doc = await latest(client, settings.admin_key)
                counts = (doc or {}).get("counts", {})
                return doc if counts.get("canary_missing") == len(held) else None

            doc = await wait_for(in_a_pass, 6, "canary_missing in a pass")
            shards = {f["shard"] for f in doc["findings"] if f["kind"] == "canary_missing"}
            assert shards == held
        assert 'event": "canary_missing"' in first.log()
        second.signal(signal.SIGCONT)
        second.stop()

        async def recovered() -> bool:
            got = scrape(port)
            return all(got[f'timewheel_canary_missing{{shard="{s}"}}'] == 0 for s in held)

        await wait_for(recovered, 30, "the canaries back once the shards moved")
    finally:
        second.signal(signal.SIGCONT)
        second.stop()
        first.stop()
        await engine.close()


async def test_a_clean_deployment_under_a_herd_and_steady_load_reports_nothing(
    standalone_url: str, tmp_path: Path
) -> None:
    settings = audit_settings(standalone_url, retry_initial_ms=100)
    engine = await Engine.connect(settings)
    port = find_free_port()
    node = NodeProcess(settings, "loaded", tmp_path, ttl_ms=2000, metrics_port=port)
    tenants = ["load-a", "load-b", "load-c"]
    acked: set[str] = set()

    async def handle(d: Delivery) -> None:
        acked.add(d.run_id)

    workers = [Worker(engine.store, t, "default", concurrency=20) for t in tenants]
    stop = asyncio.Event()
    running = [asyncio.create_task(w.run(handle, stop)) for w in workers]
    try:
        node.wait_started()
        herd_at = int(time.time() * 1000) + 1500
        herd = [NewTask(tenants[i % 3], run_at_ms=herd_at) for i in range(3000)]
        created = {c.task_id for c in await engine.tasks.create_many(herd)}
        for second in range(4):  # then 200 runs a second, spread over each second
            base = herd_at + 1000 + second * 1000
            steady = [NewTask(tenants[i % 3], run_at_ms=base + i * 5) for i in range(200)]
            created |= {c.task_id for c in await engine.tasks.create_many(steady)}

        async def all_acked() -> bool:
            return created <= acked

        await wait_for(all_acked, 60, "every run acknowledged")
        finished_ms = int(time.time() * 1000)
        async with api(engine) as client:

            async def pass_after() -> dict[str, Any] | None:
                doc = await latest(client, settings.admin_key)
                if doc is None:
                    return None
                return doc if doc["finished_at"] > ms_to_rfc3339(finished_ms) else None

            doc = await wait_for(pass_after, 20, "a pass after the load")
            assert doc["counts"] == {}, doc["findings"][:5]
        samples = scrape(port)
        assert all(v == 0 for k, v in samples.items() if k.startswith("timewheel_audit_findings{"))
        assert all(v == 0 for k, v in samples.items() if k.startswith("timewheel_canary_missing{"))
        for t in tenants:
            assert samples[f'timewheel_tenant_dispatch_lag_seconds_count{{tenant="{t}"}}'] > 0
        assert not [k for k in samples if re.search(r'tenant="~', k)]
    finally:
        stop.set()
        await asyncio.gather(*running, return_exceptions=True)
        node.stop()
        await engine.close()


@pytest.mark.timeout(420)
async def test_a_clean_deployment_at_full_load_reports_nothing(
    standalone_url: str, tmp_path: Path
) -> None:
    """The load of the audit's promise: a herd of 100,000 runs due in one second, then
    10,000 runs a second for 3 s, each acknowledged by a worker, with the auditor
    passing through; no pass during or after it finds anything."""
    settings = audit_settings(standalone_url, retry_initial_ms=100)
    engine = await Engine.connect(settings)
    port = find_free_port()
    node = NodeProcess(settings, "full", tmp_path, ttl_ms=2000, metrics_port=port)
    tenants = [f"full-{i}" for i in range(8)]
    acked: set[str] = set()

    async def handle(d: Delivery) -> None:
        acked.add(d.run_id)

    workers = [Worker(engine.store, t, "default", concurrency=50) for t in tenants]
    stop = asyncio.Event()
    running: list[asyncio.Task[Any]] = []
    created: set[str] = set()
    # Every pass seen: pass id -> (when first seen, ms; its length, s; its counts).
    passes: dict[str, tuple[float, float, dict[str, int]]] = {}

    async def watch(client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            doc = await latest(client, settings.admin_key)
            if doc is not None and doc["pass_id"] not in passes:
                passes[doc["pass_id"]] = (time.time() * 1000, doc["seconds"], doc["counts"])
            await asyncio.sleep(0.3)

    try:
        node.wait_started()
        async with api(engine) as client:
            watcher = asyncio.create_task(watch(client))
            herd_at = int(time.time() * 1000) + 15_000  # after the herd is created
            for start in range(0, 100_000, 5_000):
                batch = [
                    NewTask(tenants[i % 8], run_at_ms=herd_at + i % 1000)
                    for i in range(start, start + 5_000)
                ]
                created |= {c.task_id for c in await engine.tasks.create_many(batch)}
            running = [asyncio.create_task(w.run(handle, stop)) for w in workers]
            while time.time() * 1000 < herd_at + 1000:
                await asyncio.sleep(0.05)
            steady_from = time.monotonic()
            for tick in range(300):  # then 10,000 a second for 3 s, 100 every 10 ms
                due = int(time.time() * 1000) + 500
                batch = [NewTask(tenants[i % 8], run_at_ms=due + i // 10) for i in range(100)]
                created |= {c.task_id for c in await engine.tasks.create_many(batch)}
                pause = steady_from + (tick + 1) * 0.01 - time.monotonic()
                if pause > 0:
                    await asyncio.sleep(pause)
            assert len(created) == 130_000

            async def all_acked() -> bool:
                return created <= acked

            await wait_for(all_acked, 240, "every run acknowledged")
            load_end = time.time() * 1000

            async def pass_after() -> bool:
                return any(seen - seconds * 1000 > load_end for seen, seconds, _ in passes.values())

            await wait_for(pass_after, 120, "a pass begun after the load")
            stop.set()
            await watcher
        # A pass read the deployment during the load, one after it; none found anything.
        assert any(seen - seconds * 1000 < load_end for seen, seconds, _ in passes.values())
        assert all(counts == {} for _, _, counts in passes.values()), passes
        samples = scrape(port)
        assert all(v == 0 for k, v in samples.items() if k.startswith("timewheel_audit_findings{"))
    finally:
        stop.set()
        await asyncio.gather(*running, return_exceptions=True)
        node.stop()
        await engine.close()


async def test_a_stopped_archiver_shows_as_lag_an_old_commit_and_archiver_behind(
    standalone_url: str, postgres_dsn: str, tmp_path: Path
) -> None:
    from timewheel.archive import pg
    from timewheel.archive.archiver import Archiver

    settings = audit_settings(
        standalone_url,
        postgres_dsn=postgres_dsn,
        canary_interval_ms=0,
        audit_archiver_behind_ms=1000,
    )
    engine = await Engine.connect(settings)
    port = find_free_port()
    node = NodeProcess(settings, "arch", tmp_path, ttl_ms=2000, metrics_port=port)
    conn = await pg.connect(postgres_dsn)
    stop = asyncio.Event()
    archiver = Archiver(engine.store, conn)
    await archiver.start()
    task = asyncio.create_task(archiver.run(stop, poll_interval_s=0.05))
    try:
        node.wait_started()
        first = []
        for i in range(20):
            first.append(
                await engine.tasks.create(
                    NewTask(
                        "arch-t", run_at_ms=int(time.time() * 1000) + 600_000, payload_json=str(i)
                    )
                )
            )

        async def caught_up() -> dict[str, float] | None:
            m = scrape(port)
            return m if m.get("timewheel_archiver_lag_entries") == 0 else None

        m = await wait_for(caught_up, 20, "the archiver caught up, as the auditor sees it")
        assert m["timewheel_archiver_last_commit_timestamp_seconds"] > time.time() - 10
        assert m['timewheel_audit_findings{kind="archive_run_lost"}'] == 0
        # a run the archive holds as scheduled loses its record in Redis
        lost = first[0].task_id
        assert await engine.client.hdel(*(await engine.store.record_key(lost))) == 1

        async def lost_found() -> bool:
            got = scrape(port)
            return got['timewheel_audit_findings{kind="archive_run_lost"}'] == 1

        await wait_for(lost_found, 2 * INTERVAL_MS / 1000 + 5, "archive_run_lost")
        assert lost in node.log()
        stop.set()
        await task
        stopped_s = time.time()
        for i in range(30):
            await engine.tasks.create(
                NewTask("arch-t", run_at_ms=int(time.time() * 1000) + 600_000, payload_json=str(i))
            )

        async def behind() -> dict[str, float] | None:
            got = scrape(port)
            return got if got.get("timewheel_archiver_lag_entries", 0) >= 30 else None

        got = await wait_for(behind, 2 * INTERVAL_MS / 1000 + 5, "the archiver's lag")
        assert got["timewheel_archiver_last_commit_timestamp_seconds"] <= stopped_s

        # the events not archived pass audit_archiver_behind_ms: a finding, in the metric,
        # the log and GET /v1/audit
        async def flagged() -> dict[str, float] | None:
            got = scrape(port)
            return got if got['timewheel_audit_findings{kind="archiver_behind"}'] >= 1 else None

        await wait_for(flagged, 2 * INTERVAL_MS / 1000 + 5, "archiver_behind")
        assert '"kind": "archiver_behind"' in node.log()
        async with api(engine) as client:
            doc = await latest(client, settings.admin_key)
            assert doc is not None and doc["counts"].get("archiver_behind", 0) >= 1
            behind_ids = [f for f in doc["findings"] if f["kind"] == "archiver_behind"]
            assert behind_ids and all(f["tenant"] == "" for f in behind_ids)
        # the archiver starts again and catches up: the finding clears
        stop = asyncio.Event()
        archiver = Archiver(engine.store, archiver.conn)
        await archiver.start()
        task = asyncio.create_task(archiver.run(stop, poll_interval_s=0.05))

        async def cleared() -> bool:
            got = scrape(port)
            return (
                got['timewheel_audit_findings{kind="archiver_behind"}'] == 0
                and got.get("timewheel_archiver_lag_entries") == 0
            )

        await wait_for(cleared, 2 * INTERVAL_MS / 1000 + 10, "archiver_behind cleared")
    finally:
        stop.set()
        await asyncio.gather(task, return_exceptions=True)
        await archiver.conn.close()
        node.stop()
        await engine.close()


async def test_a_run_lost_with_its_count_is_a_count_mismatch_of_the_continuous_auditor(
    standalone_url: str, postgres_dsn: str, tmp_path: Path
) -> None:
    from timewheel.archive import pg
    from timewheel.archive.archiver import Archiver

    settings = audit_settings(standalone_url, postgres_dsn=postgres_dsn, canary_interval_ms=0)
    engine = await Engine.connect(settings)
    port = find_free_port()
    node = NodeProcess(settings, "counts", tmp_path, ttl_ms=2000, metrics_port=port)
    conn = await pg.connect(postgres_dsn)
    stop = asyncio.Event()
    archiver = Archiver(engine.store, conn)
    await archiver.start()
    task = asyncio.create_task(archiver.run(stop, poll_interval_s=0.05))
    try:
        node.wait_started()
        far = int(time.time() * 1000) + 600_000
        made = await engine.tasks.create_many(
            [NewTask(f"count-{i % 3}", run_at_ms=far + i) for i in range(30)]
        )
        created_ms = int(time.time() * 1000)
        async with api(engine) as client:
            # a clean deployment, every event archived: no count_mismatch
            async def clean_pass() -> dict[str, Any] | None:
                doc = await latest(client, settings.admin_key)
                if doc is None or doc["finished_at"] <= ms_to_rfc3339(created_ms + 500):
                    return None
                return doc if scrape(port).get("timewheel_archiver_lag_entries") == 0 else None

            doc = await wait_for(clean_pass, 2 * INTERVAL_MS / 1000 + 10, "a pass, archived")
            assert doc["counts"] == {}, doc["findings"][:5]
            assert scrape(port)['timewheel_audit_findings{kind="count_mismatch"}'] == 0
            # Redis loses a run with its count, behind the scheduler's back: its record,
            # its wheel member and its tenant's usage count; the archive still holds it
            lost = made[0]
            shard = engine.store.locate(lost.task_id)
            k, c = engine.keys, engine.client
            tenant = "count-0"
            bucket = far - far % settings.bucket_ms
            assert await c.hdel(*(await engine.store.record_key(lost.task_id))) == 1
            assert await c.hdel(k.bucket(shard, bucket), k.bucket_member(lost.task_id)) == 1
            await c.hincrby(k.usage(shard, tenant), "q:default", -1)

            async def mismatch() -> dict[str, Any] | None:
                doc = await latest(client, settings.admin_key)
                return doc if (doc or {}).get("counts", {}).get("count_mismatch") else None

            doc = await wait_for(mismatch, 2 * INTERVAL_MS / 1000 + 5, "count_mismatch")
            [found] = [f for f in doc["findings"] if f["kind"] == "count_mismatch"]
            assert found["tenant"] == tenant and found["shard"] == shard
            assert "the archive holds 10" in found["detail"] and "Redis counts 9" in found["detail"]
            assert doc["tenants"][tenant]["count_mismatch"] == 1
            assert scrape(port)['timewheel_audit_findings{kind="count_mismatch"}'] == 1
            assert '"kind": "count_mismatch"' in node.log()
    finally:
        stop.set()
        await asyncio.gather(task, return_exceptions=True)
        await archiver.conn.close()
        node.stop()
        await engine.close()
