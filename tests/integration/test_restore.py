"""Restore in process from a PostgreSQL snapshot: the event logs reopen past the
archiver checkpoint, a forced restore on standalone and Cluster brings deleted runs
back, and everything a tenant needs comes back over the API."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from redis.asyncio.cluster import RedisCluster

from timewheel.api import create_app
from timewheel.archive import pg
from timewheel.archive.restore import restore
from timewheel.archive.snapshot import take_snapshot
from timewheel.engine import Engine
from timewheel.errors import PermanentError, RestoreRefused, TaskNotFound
from timewheel.limits import Usage
from timewheel.runs.delivery import Delivery
from timewheel.runs.worker import Worker
from timewheel.store.server import RedisServer
from timewheel.tasks.model import NewTask
from timewheel.testing.archive import archive_all
from timewheel.testing.dispatch import running_scheduler, work_until
from timewheel.testing.settings import test_settings

HOUR_MS = 3_600_000


async def test_restore_opens_each_event_log_past_the_archiver_checkpoint(
    own_redis: RedisServer, postgres_dsn: str
) -> None:
    """A new server whose clock is behind the old one's must not write events the
    archiver would skip (it reads after its checkpoint)."""
    settings = test_settings(own_redis.url, postgres_dsn=postgres_dsn, shards=1)
    engine = await Engine.connect(settings)
    try:
        await engine.tasks.create_many([NewTask(tenant="a", delay_ms=HOUR_MS)])
        await archive_all(engine, postgres_dsn)
        async with pg.connection(postgres_dsn) as conn:
            await take_snapshot(engine.store, conn)
            ahead_ms = int(time.time() * 1000) + HOUR_MS  # the old server's clock, say
            await conn.execute(
                "UPDATE archive_checkpoints SET last_ms = %s, last_seq = 5", (ahead_ms,)
            )
            await conn.commit()
        await engine.client.flushall()
        await restore(settings)
        await engine.tasks.create_many([NewTask(tenant="a", delay_ms=HOUR_MS)])
        entries: Any = await engine.client.xrange(engine.keys.events(0))
        assert [e[1][b"e"] for e in entries] == [b"restored", b"created"]
        assert entries[0][0] == f"{ahead_ms}-6".encode()
        archiver = await archive_all(engine, postgres_dsn)
        assert archiver.archived_total == 2  # both read, none skipped
    finally:
        await engine.close()


async def test_forced_restore_on_standalone_and_cluster(engine: Engine, postgres_dsn: str) -> None:
    """The session's servers hold other tests' keys: only --force may write there, and the
    runs of this test's prefix, deleted, come back."""
    made = await engine.tasks.create_many(
        [NewTask(tenant=f"t{i % 4}", payload_json=str(i), delay_ms=HOUR_MS) for i in range(30)]
    )
    await archive_all(engine, postgres_dsn)
    async with pg.connection(postgres_dsn) as conn:
        await take_snapshot(engine.store, conn)
    settings = test_settings(
        engine.settings.redis_url, prefix=engine.settings.prefix, postgres_dsn=postgres_dsn
    )
    with pytest.raises(RestoreRefused, match="not empty"):
        await restore(settings)
    pattern = f"{{{engine.settings.prefix}:*"
    client = engine.client
    if isinstance(client, RedisCluster):
        for node in client.get_primaries():
            async for key in client.scan_iter(match=pattern, target_nodes=node):
                await client.delete(key)
    else:
        async for key in client.scan_iter(match=pattern):
            await client.delete(key)
    with pytest.raises(TaskNotFound):
        await engine.tasks.get("t0", made[0].task_id)
    result = await restore(settings, force=True)
    assert (result.restored, result.existing) == (30, 0)
    for i, r in enumerate(made):
        task = await engine.tasks.get(f"t{i % 4}", r.task_id)
        assert (task.state, task.payload_json) == ("scheduled", str(i))


ADMIN = "tw_admin_restore_test_key"


async def _api(engine: Engine) -> httpx.AsyncClient:
    app = create_app(engine.settings, engine=engine)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://tw")


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def _finish(engine: Engine, tenant: str, runs: int) -> None:
    """Dispatch what is due and work it: payload {"ok": true} succeeds, else dead."""
    done: list[str] = []

    async def handler(d: Delivery) -> None:
        done.append(d.run_id)
        if not (isinstance(d.payload, dict) and d.payload.get("ok")):
            raise PermanentError("refused by the handler")

    async with running_scheduler(engine):
        await work_until(Worker(engine.store, tenant), handler, lambda: len(done) >= runs, 30)


async def test_everything_a_tenant_needs_comes_back(
    own_redis: RedisServer, postgres_dsn: str
) -> None:
    """Tenants, limits, live keys (revoked ones stay revoked), dead letters with their
    reason, finished records (idempotency keys dedupe), and the usage counts limits are
    checked against: some changed before the snapshot, some only in the archived logs."""
    settings = test_settings(own_redis.url, postgres_dsn=postgres_dsn, admin_key=ADMIN, shards=4)
    admin = _bearer(ADMIN)
    engine = await Engine.connect(settings)
    try:
        async with await _api(engine) as api:
            for name, limits in (("a", {"max_pending": 10}), ("b", {})):
                made = await api.post(
                    "/v1/tenants", json={"id": name, "limits": limits}, headers=admin
                )
                assert made.status_code == 201, made.text
            key_a1 = (await api.post("/v1/tenants/a/keys", headers=admin)).json()
            key_a2 = (await api.post("/v1/tenants/a/keys", headers=admin)).json()
            key_b1 = (await api.post("/v1/tenants/b/keys", headers=admin)).json()
            revoked = await api.delete(f"/v1/tenants/a/keys/{key_a2['key_id']}", headers=admin)
            assert revoked.status_code in (200, 204), revoked.text
            a = _bearer(key_a1["key"])

            async def create(body: dict[str, Any]) -> dict[str, Any]:
                resp = await api.post("/v1/tasks", json=body, headers=a)
                assert resp.status_code == 201, resp.text
                return dict(resp.json())

            far = await create({"delay": 3600, "payload": {"far": 1}})
            ok1 = await create({"delay": 0, "payload": {"ok": True}, "idempotency_key": "ok-1"})
            dead1 = await create({"delay": 0, "payload": {"ok": False, "n": 1}})
            gone = await create({"delay": 3600, "payload": {"cancel": 1}})
            assert (await api.delete(f"/v1/tasks/{gone['id']}", headers=a)).status_code == 200
            await _finish(engine, "a", 2)
            await archive_all(engine, postgres_dsn)
            async with pg.connection(postgres_dsn) as conn:
                snap = await take_snapshot(engine.store, conn)
            assert (snap.tenants, snap.keys) == (2, 2)

            # After the snapshot, in the archived logs only.
            made = await api.post("/v1/tenants", json={"id": "c", "limits": {}}, headers=admin)
            assert made.status_code == 201
            key_c = (await api.post("/v1/tenants/c/keys", headers=admin)).json()
            key_a3 = (await api.post("/v1/tenants/a/keys", headers=admin)).json()
            revoked = await api.delete(f"/v1/tenants/b/keys/{key_b1['key_id']}", headers=admin)
            assert revoked.status_code in (200, 204)
            ok2 = await create({"delay": 0, "payload": {"ok": True}, "idempotency_key": "ok-2"})
            dead2 = await create({"delay": 0, "payload": {"ok": False, "n": 2}})
            await _finish(engine, "a", 2)
            changed = await api.patch(
                "/v1/tenants/a", json={"limits": {"max_pending": 3}}, headers=admin
            )
            assert changed.status_code == 200, changed.text
            await archive_all(engine, postgres_dsn)
            await engine.client.flushall()
            result = await restore(settings)
        assert (result.restored, result.finished, result.dead) == (1, 3, 2)
        # a2 was revoked before the archiver first read tenant a: it never reached
        # PostgreSQL; b1 was archived live, then revoked.
        assert (result.tenants, result.keys, result.revoked_keys) == (3, 3, 1)
    finally:
        await engine.close()

    engine = await Engine.connect(settings)
    try:
        async with await _api(engine) as api:
            for key in (key_a1, key_a3, key_c):
                assert (await api.get("/v1/tasks", headers=_bearer(key["key"]))).status_code == 200
            for key in (key_a2, key_b1):
                assert (await api.get("/v1/tasks", headers=_bearer(key["key"]))).status_code == 401
            got = await api.get("/v1/tenants/a", headers=admin)
            assert got.status_code == 200 and got.json()["limits"]["max_pending"] == 3
            assert (await api.get("/v1/tenants/c", headers=admin)).status_code == 200
            dead = (await api.get("/v1/dead-letters", headers=a)).json()["items"]
            assert {d["run_id"] for d in dead} == {dead1["id"], dead2["id"]}
            assert all(d["reason"] == "failed" for d in dead)
            assert [d["error"] for d in dead] == ["PermanentError: refused by the handler"] * 2
            assert {d["payload"]["n"] for d in dead} == {1, 2}
            for key, task in (("ok-1", ok1), ("ok-2", ok2)):
                again = await api.post(
                    "/v1/tasks", json={"delay": 0, "payload": {"ok": True}, "idempotency_key": key},
                    headers=a,
                )  # fmt: skip
                assert again.status_code == 200, again.text
                assert (again.json()["id"], again.json()["state"]) == (task["id"], "succeeded")
            cancelled = await api.get(f"/v1/tasks/{gone['id']}", headers=a)
            assert cancelled.json()["state"] == "cancelled"
            assert (await api.get(f"/v1/tasks/{far['id']}", headers=a)).json()[
                "state"
            ] == "scheduled"
            # max_pending 3 counts the far task restored, then a replayed dead letter and
            # one more create; the next create is refused.
            replayed = await api.post(f"/v1/dead-letters/{dead1['id']}/replay", headers=a)
            assert replayed.status_code == 200, replayed.text
            assert (await api.post("/v1/tasks", json={"delay": 3600}, headers=a)).status_code == 201
            over = await api.post("/v1/tasks", json={"delay": 3600}, headers=a)
            assert over.status_code == 429, over.text
        usage = Usage()
        for shard in engine.store.shards_of("a"):
            raw: Any = await engine.client.hgetall(engine.keys.usage(shard, "a"))
            usage = usage.plus(Usage.from_hash(raw))
        assert usage.runs == 3
    finally:
        await engine.close()
