"""kill -9 of redis-server while tasks are created and dispatched: nothing acknowledged is lost."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

from timewheel.engine import Engine
from timewheel.errors import RedisUnavailable
from timewheel.store.server import RedisServer
from timewheel.tasks.model import NewTask
from timewheel.testing.dispatch import all_deliveries, running_scheduler
from timewheel.testing.settings import test_settings


async def test_acknowledged_creates_survive_kill_9_of_redis(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis", appendfsync="always")
    (tmp_path / "redis").mkdir()
    server.start()
    engine = await Engine.connect(test_settings(server.url, shards=8))
    acknowledged: dict[str, str] = {}  # task id -> tenant, for every create that got an answer
    lost_calls = 0
    try:
        async with running_scheduler(engine):
            for step in range(40):
                if step == 20:
                    server.kill()  # SIGKILL: no shutdown, no final fsync
                    killed_at = time.monotonic()
                if step == 24:
                    server.start()  # replays the AOF
                batch = [
                    NewTask(tenant=f"t{i % 7}", payload_json=str(step), delay_ms=500)
                    for i in range(50)
                ]
                try:
                    results = await engine.tasks.create_many(batch)
                    acknowledged.update(
                        (r.task_id, new.tenant) for r, new in zip(results, batch, strict=True)
                    )
                except RedisUnavailable:
                    lost_calls += 1  # not acknowledged: the client would retry these
                await asyncio.sleep(0.05)
            assert lost_calls >= 1 and time.monotonic() - killed_at < 30

            async def everything_out() -> bool:
                return len(await all_deliveries(engine)) >= len(acknowledged)

            deadline = time.monotonic() + 20
            while not await everything_out():
                assert time.monotonic() < deadline, "acknowledged runs were not dispatched"
                await asyncio.sleep(0.2)
        counts = Counter(d.run_id for d in await all_deliveries(engine))
        assert set(acknowledged) <= set(counts), "an acknowledged create was lost"
        assert max(counts.values()) == 1
        for task_id, tenant in list(acknowledged.items())[::50]:
            assert (await engine.tasks.get(tenant, task_id)).state == "dispatched"
    finally:
        await engine.close()
        server.stop()
