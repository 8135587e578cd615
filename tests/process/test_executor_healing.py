"""Executors heal themselves: a `timewheel worker` process and a webhook executor keep
running through Redis killed with SIGKILL and restarted from its AOF, and through a
Cluster primary dying and its replica taking over. Nothing acknowledged is lost, each
run is delivered once, and no executor is restarted."""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import redis

from timewheel.engine import Engine
from timewheel.errors import RedisUnavailable
from timewheel.store.server import RedisServer
from timewheel.tasks.model import NewTask
from timewheel.testing.nodes import settings_env
from timewheel.testing.redis_cluster import RedisClusterServers
from timewheel.testing.settings import test_settings
from timewheel.testing.waiting import until

CLI = [sys.executable, "-m", "timewheel.cli"]


class Executors:
    """A scheduler, a worker (queue jobs) and a webhook executor (queue hooks) of tenant a."""

    def __init__(self, redis_url: str, engine: Engine, tmp: Path, hook_url: str) -> None:
        self.tmp = tmp
        self.handled_log = tmp / "handled.log"
        env = {**settings_env(engine.settings), "TW_TEST_LOG": str(self.handled_log)}
        url = ["--redis-url", redis_url]
        commands = {
            "scheduler": ["scheduler", *url],
            "worker": ["worker", "--app", "timewheel.testing.apps:note", "--tenant", "a",
                       "--queue", "jobs", *url],
            "webhook": ["webhook", "--url", hook_url, "--tenant", "a", "--queue", "hooks", *url],
        }  # fmt: skip
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        for name, args in commands.items():
            with (tmp / f"{name}.log").open("wb") as out:
                self.procs[name] = subprocess.Popen(
                    [*CLI, *args], stdout=out, stderr=subprocess.STDOUT, env=env
                )

    def alive(self) -> None:
        for name, proc in self.procs.items():
            log = (self.tmp / f"{name}.log").read_text()
            assert proc.poll() is None, f"{name} exited:\n{log[-3000:]}"
            assert "Traceback" not in log, log[-3000:]

    def handled(self) -> Counter[str]:
        if not self.handled_log.exists():
            return Counter()
        return Counter(line.split()[0] for line in self.handled_log.read_text().splitlines())

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def _create(engine: Engine, queue: str, n: int, delay_ms: int = 0) -> list[str]:
    """Create n runs; a create refused while the server is down is tried again with the
    same idempotency keys (a refused write may have run: it is found, not doubled)."""
    batch = secrets.token_hex(4)
    for _ in range(200):
        try:
            made = await engine.tasks.create_many(
                [
                    NewTask(
                        tenant="a", queue=queue, delay_ms=delay_ms, idempotency_key=f"{batch}-{i}"
                    )
                    for i in range(n)
                ]
            )
            return [m.task_id for m in made]
        except RedisUnavailable:
            await asyncio.sleep(0.1)
    raise AssertionError("creates never went through")


async def _exercise(
    engine: Engine, ex: Executors, hooks: list[str], outage: Callable[[], Awaitable[None]]
) -> None:
    """Runs before, across and after `outage`: each delivered once, nothing lost."""
    before = await _create(engine, "jobs", 10) + await _create(engine, "hooks", 10)

    async def delivered(ids: list[str]) -> bool:
        seen = set(ex.handled()) | set(hooks)
        return set(ids) <= seen

    await until("runs before the outage", lambda: delivered(before))
    await asyncio.sleep(0.5)  # acks replicated / fsynced
    # Due in 3 s: created before the outage, delivered after it.
    across = await _create(engine, "jobs", 10, 3000) + await _create(engine, "hooks", 10, 3000)
    await outage()
    after = await _create(engine, "jobs", 10) + await _create(engine, "hooks", 10)
    await until("runs across and after the outage", lambda: delivered(across + after), 90)
    ex.alive()
    everything = before + across + after

    async def all_succeeded() -> bool:  # the ack follows the handler's end by a few ms
        states = [(await engine.tasks.get("a", task_id)).state for task_id in everything]
        return set(states) == {"succeeded"}

    await until("every run succeeded", all_succeeded, 30)
    jobs, posted = ex.handled(), Counter(hooks)
    assert set(jobs.values()) == {1} and set(posted.values()) == {1}  # each run once
    assert set(jobs) | set(posted) == set(everything)


async def test_executors_ride_out_redis_restarted_from_its_aof(
    own_redis: RedisServer,
    tmp_path: Path,
    receiver: tuple[str, list[str]],
) -> None:
    hook_url, hooks = receiver
    engine = await Engine.connect(test_settings(own_redis.url))
    ex = Executors(own_redis.url, engine, tmp_path, hook_url)
    try:

        async def restart() -> None:
            own_redis.kill()  # SIGKILL: what the AOF holds (appendfsync always) is all
            await asyncio.sleep(1.0)
            own_redis.start()  # same port, same data dir: the AOF is replayed

        await _exercise(engine, ex, hooks, restart)
    finally:
        ex.stop()
        await engine.close()


@pytest.mark.cluster
async def test_executors_ride_out_a_replica_promotion(
    tmp_path: Path,
    receiver: tuple[str, list[str]],
) -> None:
    hook_url, hooks = receiver
    cluster = RedisClusterServers(
        tmp_path / "cluster",
        replicas_per_primary=1,
        extra_config={"cluster-node-timeout": "1000"},
    )
    with cluster:
        engine = await Engine.connect(test_settings(cluster.url, shards=8))
        ex = Executors(cluster.url, engine, tmp_path, hook_url)
        try:

            async def failover() -> None:
                victim = next(s for s in cluster.servers[:3] if s.url != cluster.url)
                victim.kill()
                deadline = time.monotonic() + 30
                alive = redis.Redis(host=cluster.servers[0].host, port=cluster.servers[0].port)
                while True:  # a replica of the victim promoted, and every slot served again
                    promoted = [
                        s
                        for s in cluster.servers[3:]
                        if redis.Redis(host=s.host, port=s.port).info("replication")["role"]
                        == "master"
                    ]
                    state = alive.execute_command("CLUSTER", "INFO").decode()  # type: ignore[no-untyped-call]
                    if promoted and "cluster_state:ok" in state:
                        return
                    assert time.monotonic() < deadline, "no replica took over"
                    await asyncio.sleep(0.2)

            await _exercise(engine, ex, hooks, failover)
        finally:
            ex.stop()
            await engine.close()
