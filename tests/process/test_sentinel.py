"""Redis Sentinel: a primary, a replica and three sentinels; `timewheel api` and
`timewheel scheduler` processes on the redis+sentinel:// URL. The primary is killed
with SIGKILL: Sentinel promotes the replica, the API answers 503 during the switch
(never 500) and creates again within a bounded wait (a 503 is sent again with the same
idempotency key), and every run acknowledged before and after the kill is dispatched
into its ready stream on the promoted replica. The seconds from the kill to the first
dispatch on the new primary are printed (no timing is asserted beyond bounded waits).

A manual failover (SENTINEL FAILOVER) demotes the primary while it runs: an in-process
scheduler, worker and creates carry on; a packed connection that reads READONLY is
closed so that it connects again. Also: the CLI refuses a malformed Sentinel URL
(message, exit 2) and reports sentinels that do not answer (exit 1).
"""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hiredis
import httpx
import redis
import redis.asyncio
from redis.exceptions import ReadOnlyError

from timewheel.engine import Engine
from timewheel.errors import RedisUnavailable
from timewheel.models import ms_to_rfc3339
from timewheel.runs.delivery import Delivery
from timewheel.runs.worker import Worker
from timewheel.store.connection import connect
from timewheel.store.pipeline import Lane
from timewheel.store.server import find_free_port, ping_client
from timewheel.tasks.model import NewTask
from timewheel.testing.api import tenant_headers
from timewheel.testing.apiserver import start_api
from timewheel.testing.dispatch import all_deliveries, running_scheduler
from timewheel.testing.nodes import NodeProcess
from timewheel.testing.sentinel import SERVICE, SentinelDeployment
from timewheel.testing.settings import test_settings

CLI = [sys.executable, "-m", "timewheel.cli"]
TENANT = "acme"


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclasses.dataclass
class Creates:
    """What the client saw: acknowledged creates and every status it was answered."""

    acked: dict[str, str] = dataclasses.field(default_factory=dict)
    """idempotency key -> task id"""
    statuses: Counter[int] = dataclasses.field(default_factory=Counter)
    transport_errors: int = 0

    async def create(
        self, http: httpx.AsyncClient, key: str, run_at_ms: int, *, within_s: float
    ) -> float:
        """Create until answered 2xx (a 503 or a transport error is sent again, same
        body and key); the monotonic time of the answer."""
        body = {"run_at": ms_to_rfc3339(run_at_ms), "idempotency_key": key, "payload": key}
        deadline = time.monotonic() + within_s
        while True:
            try:
                resp = await http.post("/v1/tasks", json=body)
            except httpx.TransportError:
                self.transport_errors += 1
            else:
                self.statuses[resp.status_code] += 1
                if resp.status_code in (200, 201):
                    self.acked[key] = resp.json()["id"]
                    return time.monotonic()
                assert resp.status_code == 503, f"{key}: {resp.status_code} {resp.text}"
                assert resp.json()["error"]["code"] == "unavailable", resp.text
            assert time.monotonic() < deadline, f"{key} not acknowledged in {within_s} s"
            await asyncio.sleep(0.1)


async def test_a_replica_takes_over_when_the_primary_is_killed(tmp_path: Path) -> None:
    with SentinelDeployment(tmp_path / "redis") as deployment:
        old = (deployment.primary.host, deployment.primary.port)
        api_proc, api = start_api(deployment.url, tmp_path / "api.log")
        node: NodeProcess | None = None
        engine: Engine | None = None
        try:
            node = NodeProcess(api.settings, "n1", tmp_path, ttl_ms=2000)
            node.wait_started()
            engine = await Engine.connect(api.settings)
            assert engine.store.replicas_ack == 1  # auto: the primary has a replica
            headers = await tenant_headers(engine, TENANT)
            creates = Creates()
            async with httpx.AsyncClient(base_url=api.url, headers=headers, timeout=15) as http:
                # Due at once: dispatched on the first primary (and replicated).
                for i in range(10):
                    await creates.create(http, f"early-{i}", now_ms() + 300, within_s=10)
                await asyncio.sleep(1.5)
                # Due a few seconds ahead: dispatched after the kill, by the new primary.
                for i in range(30):
                    await creates.create(http, f"before-{i}", now_ms() + 2000 + 50 * i, within_s=10)
                assert creates.statuses == Counter({201: 40}), creates.statuses

                kill_ms, killed = now_ms(), time.monotonic()
                deployment.primary.kill()
                # Creates go on: each is sent again (503s) until the new primary has it.
                answered = await creates.create(http, "after-0", now_ms() + 1000, within_s=60)
                print(f"sentinel: creates answered again {answered - killed:.2f} s after kill -9")
                for i in range(1, 20):
                    await creates.create(http, f"after-{i}", now_ms() + 1000, within_s=30)

            deadline = time.monotonic() + 30
            while (promoted := deployment.named_primary()) in (None, old):
                assert time.monotonic() < deadline, "Sentinel never promoted the replica"
                await asyncio.sleep(0.2)
            assert promoted == (deployment.replicas[0].host, deployment.replicas[0].port)

            # Read on the promoted server itself: every acknowledged run is there.
            direct = dataclasses.replace(api.settings, redis_url=deployment.server_at(promoted).url)
            reader = await Engine.connect(direct)
            try:
                wanted = set(creates.acked.values())
                deadline = time.monotonic() + 40
                while True:
                    deliveries = await all_deliveries(reader)
                    missing = wanted - {d.run_id for d in deliveries}
                    if not missing:
                        break
                    assert time.monotonic() < deadline, (
                        f"{len(missing)} of {len(wanted)} acknowledged runs never dispatched "
                        f"on the new primary: {sorted(missing)[:5]}"
                    )
                    await asyncio.sleep(0.25)
            finally:
                await reader.close()
            after = [d.dispatched_ms for d in deliveries if d.dispatched_ms >= kill_ms]
            assert after, "nothing was dispatched after the kill"
            first_s = (min(after) - kill_ms) / 1000
            print(
                f"sentinel: first dispatch on the new primary {first_s:.2f} s after kill -9; "
                f"statuses {dict(creates.statuses)}, "
                f"{creates.transport_errors} transport errors"
            )
            assert len(creates.acked) == 60
            assert set(creates.statuses) <= {200, 201, 503}
            assert creates.transport_errors == 0
        finally:
            if engine is not None:
                await engine.close()
            if node is not None:
                node.stop()
            api_proc.terminate()
            api_proc.wait(timeout=20)
    for log in (tmp_path / "api.log", tmp_path / "n1.log"):
        text = log.read_text()
        assert "Traceback" not in text, text[-4000:]
        assert "unhandled_error" not in text, text[-4000:]


def test_the_cli_refuses_a_malformed_sentinel_url_with_exit_2() -> None:
    for command, url in (
        ("api", "redis+sentinel://127.0.0.1:26379"),
        ("scheduler", "redis+sentinel://127.0.0.1:port/tw"),
        ("audit", "redis+sentinel:///tw"),
    ):
        done = subprocess.run(
            [*CLI, command, "--redis-url", url], capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 2, (command, done.stderr)
        assert "Sentinel URL" in done.stderr and "Traceback" not in done.stderr


def test_sentinels_that_do_not_answer_are_exit_1() -> None:
    port = find_free_port()
    done = subprocess.run(
        [*CLI, "scheduler", "--redis-url", f"redis+sentinel://127.0.0.1:{port}/tw"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert "cannot reach the primary of redis+sentinel://" in done.stderr
    assert "Traceback" not in done.stderr


async def test_scheduler_worker_and_creates_carry_on_through_a_manual_failover(
    tmp_path: Path,
) -> None:
    """SENTINEL FAILOVER: the primary is demoted while it runs (Sentinel closes its
    clients' connections and makes it a replica of the promoted one); an in-process
    scheduler, worker and creates carry on against the new primary."""
    with SentinelDeployment(tmp_path / "redis") as deployment:
        old = (deployment.primary.host, deployment.primary.port)
        engine = await Engine.connect(test_settings(deployment.url))
        handled: set[str] = set()

        async def handler(delivery: Delivery) -> None:
            handled.add(delivery.run_id)

        async def create(key: str) -> str:
            new = NewTask(tenant=TENANT, delay_ms=200, payload_json='"x"', idempotency_key=key)
            deadline = time.monotonic() + 30
            while True:
                try:
                    return (await engine.tasks.create(new)).task_id
                except RedisUnavailable:  # ReplicasBehind too: sent again, same key
                    assert time.monotonic() < deadline, f"{key} never acknowledged"
                    await asyncio.sleep(0.1)

        try:
            worker = Worker(engine.store, TENANT)
            stop = asyncio.Event()
            async with running_scheduler(engine):
                working = asyncio.create_task(worker.run(handler, stop))
                try:
                    before = {await create(f"before-{i}") for i in range(10)}
                    await until_true("runs handled before", lambda: before <= handled, 20)
                    sentinel = deployment.sentinels[0].client()
                    try:
                        sentinel.execute_command("SENTINEL", "FAILOVER", SERVICE)  # type: ignore[no-untyped-call]
                    finally:
                        sentinel.close()

                    def switched() -> bool:
                        named = deployment.named_primary()
                        return named is not None and named != old and role(old) == "slave"

                    await until_true("the failover", switched, 30)
                    after = {await create(f"after-{i}") for i in range(10)}
                    await until_true("runs handled after", lambda: after <= handled, 30)
                    assert not working.done()
                finally:
                    stop.set()
                    await asyncio.wait_for(working, 15)
            for run_id in before | after:
                assert (await engine.tasks.get(TENANT, run_id)).state == "succeeded"
        finally:
            await engine.close()


async def until_true(what: str, check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        await asyncio.sleep(0.1)


def role(address: tuple[str, int]) -> str | None:
    client = ping_client(*address)
    try:
        return str(client.info("replication").get("role"))
    except (redis.ConnectionError, redis.TimeoutError):
        return None
    finally:
        client.close()


async def test_a_packed_connection_that_reads_readonly_connects_again(tmp_path: Path) -> None:
    """A connection whose replies are read past redis-py's read_response (a lane's, a
    worker's) is closed on a READONLY reply, so that on a Sentinel URL it connects again
    to the primary the sentinels name instead of writing to a demoted one forever."""
    with SentinelDeployment(tmp_path / "redis", replicas=1) as deployment:
        client = await connect(deployment.replicas[0].url)
        assert isinstance(client, redis.asyncio.Redis)
        lane = Lane(client)
        try:
            command: tuple[Any, ...] = ("SET", "k", "v")
            packed = hiredis.pack_command(command)
            [reply] = await lane.exchange(packed, 1)
            assert isinstance(reply, ReadOnlyError)
            [conn] = lane._idle
            assert not conn.is_connected
        finally:
            await lane.close()
            await client.aclose()
