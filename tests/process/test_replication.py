"""Writes wait for replicas (min_replicas_ack): a standalone primary with a replica, and a
3-primary + 3-replica Cluster in which a primary is killed and its replica takes over."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from timewheel.api import create_app
from timewheel.engine import Engine
from timewheel.errors import RedisUnavailable, ReplicasBehind
from timewheel.store.server import RedisServer
from timewheel.tasks.model import NewTask
from timewheel.testing.api import tenant_headers
from timewheel.testing.dispatch import all_deliveries, running_scheduler
from timewheel.testing.redis_cluster import RedisClusterServers
from timewheel.testing.settings import test_settings


def sync_client(server: RedisServer) -> redis.Redis:
    return redis.Redis(host=server.host, port=server.port)


@pytest.fixture
def primary_and_replica(tmp_path: Path) -> Iterator[tuple[RedisServer, RedisServer]]:
    (tmp_path / "primary").mkdir()
    (tmp_path / "replica").mkdir()
    primary = RedisServer(tmp_path / "primary")
    with primary:
        replica = RedisServer(
            tmp_path / "replica",
            extra_config={"replicaof": f"{primary.host} {primary.port}"},
        )
        with replica:
            deadline = time.monotonic() + 20
            while sync_client(replica).info("replication").get("master_link_status") != "up":
                assert time.monotonic() < deadline, "the replica never attached"
                time.sleep(0.05)
            yield primary, replica


async def test_writes_wait_for_a_replica_and_answer_503_without_one(
    primary_and_replica: tuple[RedisServer, RedisServer],
) -> None:
    primary, replica = primary_and_replica
    engine = await Engine.connect(test_settings(primary.url, replica_wait_ms=300))
    try:
        assert engine.store.replicas_ack == 1  # auto: the primary has a replica
        made = await engine.tasks.create(NewTask(tenant="a", delay_ms=60_000, payload_json='"x"'))
        assert made.created
        # The write is on the replica once the create answered.
        raw = sync_client(replica).hget(
            *(await engine.store.record_key(made.task_id)),
        )
        assert raw is not None

        app = create_app(engine.settings, engine=engine)
        headers = await tenant_headers(engine, "a")
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://tw") as http:
            sync_client(replica).client_pause(3000, all=True)  # it stops acking
            body = {"delay": 60, "payload": {"n": 1}}
            slow = await http.post(
                "/v1/tasks", json=body, headers={**headers, "Idempotency-Key": "k1"}
            )
            assert slow.status_code == 503, slow.text
            assert slow.json()["error"]["code"] == "unavailable"
            with pytest.raises(ReplicasBehind):
                await engine.tasks.cancel("a", made.task_id)
            await asyncio.sleep(3.2)  # the replica acks again
            again = await http.post(
                "/v1/tasks", json=body, headers={**headers, "Idempotency-Key": "k1"}
            )
            # The first try ran on the primary: the retry finds it, it is not doubled.
            assert again.status_code == 200, again.text
        assert (await engine.tasks.get("a", made.task_id)).state == "cancelled"
    finally:
        await engine.close()


async def test_no_acknowledged_create_is_lost_when_a_cluster_primary_dies(
    tmp_path: Path,
) -> None:
    cluster = RedisClusterServers(
        tmp_path / "cluster",
        replicas_per_primary=1,
        extra_config={"cluster-node-timeout": "1000"},
    )
    with cluster:
        settings = test_settings(cluster.url, shards=16, replica_wait_ms=2000)
        engine = await Engine.connect(settings)
        acked: dict[str, str] = {}
        failed = 0
        try:
            assert engine.store.replicas_ack == 1
            victim = next(
                s for s in cluster.servers[:3] if s.url != cluster.url
            )  # a primary other than the one the client was given
            async with running_scheduler(engine):
                started = time.monotonic()
                step = 0
                while time.monotonic() - started < 14:
                    if step == 10:
                        victim.kill()
                    batch = [
                        NewTask(
                            tenant=f"t{i}",
                            delay_ms=300,
                            payload_json=str(step),
                            idempotency_key=f"{step}-{i}-{secrets.token_hex(2)}",
                        )
                        for i in range(20)
                    ]
                    try:
                        for new, res in zip(
                            batch, await engine.tasks.create_many(batch), strict=True
                        ):
                            acked[res.task_id] = new.tenant
                    except RedisUnavailable:
                        failed += 1  # not acknowledged; a client would retry with its key
                    step += 1
                    await asyncio.sleep(0.1)
                # The promoted replica, alone, took the victim's writes (answered on
                # its own AOF); the creates sent while no node served them failed.
                assert engine.store.replica_wait.unreplicated >= 1, (
                    f"no write reached the promoted replica ({failed} creates failed)"
                )
                deadline = time.monotonic() + 30
                while True:
                    sent = {d.run_id for d in await all_deliveries(engine)}
                    if set(acked) <= sent:
                        break
                    assert time.monotonic() < deadline, (
                        f"{len(set(acked) - sent)} of {len(acked)} acknowledged runs not sent"
                    )
                    await asyncio.sleep(0.3)
            for task_id, tenant in acked.items():
                assert (await engine.tasks.get(tenant, task_id)).state == "dispatched"
        finally:
            await engine.close()


async def test_after_a_failover_a_primary_without_replica_answers_alone_unless_strict(
    tmp_path: Path,
) -> None:
    """Auto (-1): the promoted replica has no replica of its own, so its writes are
    answered on its own AOF (counted) rather than refused until replication is mended;
    strict (1): they are refused (ReplicasBehind, a 503) until a replica attaches."""
    cluster = RedisClusterServers(
        tmp_path / "cluster",
        replicas_per_primary=1,
        extra_config={"cluster-node-timeout": "1000"},
    )
    with cluster:
        auto = await Engine.connect(test_settings(cluster.url, shards=8, replica_wait_ms=300))
        strict = await Engine.connect(
            test_settings(
                cluster.url,
                prefix=auto.settings.prefix,
                shards=8,
                replica_wait_ms=300,
                min_replicas_ack=1,
            )
        )
        try:
            assert auto.store.replicas_ack == strict.store.replicas_ack == 1

            def batch(step: int) -> list[NewTask]:  # every shard, each a new key
                return [
                    NewTask(tenant=f"t{i}", delay_ms=60_000, idempotency_key=f"{step}-{i}")
                    for i in range(40)
                ]

            assert len({r.task_id[:3] for r in await auto.tasks.create_many(batch(0))}) == 8
            assert auto.store.replica_wait.unreplicated == 0
            victim = next(s for s in cluster.servers[:3] if s.url != cluster.url)
            victim.kill()
            alive = sync_client(cluster.servers[0])
            deadline = time.monotonic() + 30
            while not (
                "cluster_state:ok" in alive.execute_command("CLUSTER", "INFO").decode()  # type: ignore[no-untyped-call]
                and any(
                    sync_client(s).info("replication")["role"] == "master"
                    for s in cluster.servers[3:]
                )
            ):
                assert time.monotonic() < deadline, "no replica took over"
                await asyncio.sleep(0.2)

            async def create(engine: Engine, step: int) -> list[str]:
                for _ in range(100):  # while the clients learn the new topology
                    try:
                        return [r.task_id for r in await engine.tasks.create_many(batch(step))]
                    except ReplicasBehind as exc:
                        # Sent while the client re-read the topology: its WAIT may not
                        # have followed the writes, so they are unconfirmed (retried).
                        if "could not be read" not in str(exc):
                            raise
                        await asyncio.sleep(0.1)
                    except RedisUnavailable:
                        await asyncio.sleep(0.1)
                raise AssertionError("creates never went through")

            made = await create(auto, 1)
            assert len(made) == 40
            promoted = next(
                sync_client(s)
                for s in cluster.servers[3:]
                if sync_client(s).info("replication")["role"] == "master"
            )
            if int(promoted.info("replication").get("connected_slaves", 0)):
                return  # a replica migrated to the promoted primary: nothing runs alone
            # The first batch may have gone through in a try whose answer was lost while the
            # client learnt the new topology (retried: duplicates, nothing written again);
            # a batch on the settled topology writes on the promoted primary alone.
            assert len(await create(auto, 4)) == 40
            assert auto.store.replica_wait.unreplicated >= 1  # the promoted primary's writes
            for task_id, new in zip(made, batch(1), strict=True):
                assert (await auto.tasks.get(new.tenant, task_id)).state == "scheduled"
            # Known to be alone now: the next writes send it no WAIT (none waits for
            # replica_wait_ms), and each is counted.

            def waits() -> int:
                return int(promoted.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))

            waits_before, counted = waits(), auto.store.replica_wait.unreplicated
            assert len(await create(auto, 2)) == 40
            assert waits() == waits_before
            assert auto.store.replica_wait.unreplicated > counted
            with pytest.raises(ReplicasBehind, match="reached 0 of the 1 replica"):
                await create(strict, 3)
        finally:
            await strict.close()
            await auto.close()
