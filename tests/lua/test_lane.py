"""The lane of a standalone store (timewheel/store/pipeline.py): kept connections for
packed calls, which must behave as redis-py's own way through a call does."""

import asyncio
import time
from typing import Any

import hiredis
import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from timewheel.config import Settings
from timewheel.engine import Engine, NewTask
from timewheel.errors import RedisUnavailable
from timewheel.store.deadlines import Deadlines
from timewheel.store.server import RedisServer
from timewheel.store.shard import Call


def _packed(*command: Any) -> bytes:
    packed: bytes = hiredis.pack_command(command)
    return packed


async def test_a_create_after_a_restart_reconnects_the_kept_connection(
    own_redis: RedisServer,
) -> None:
    """The connection kept from before a restart saw its end while idle: the next create
    connects again instead of failing (answered 503 by the API)."""
    engine = await Engine.connect(Settings(redis_url=own_redis.url))
    try:
        first = await engine.tasks.create(NewTask(tenant="t", delay_ms=60_000))
        assert engine.store.lane is not None and len(engine.store.lane._idle) == 1
        await asyncio.to_thread(own_redis.stop)
        await asyncio.to_thread(own_redis.start)
        await asyncio.sleep(0.05)  # the loop sees the old socket's end
        second = await engine.tasks.create(NewTask(tenant="t", delay_ms=60_000))
        assert second.created and second.task_id != first.task_id
        assert (await engine.tasks.get("t", second.task_id)).state == "scheduled"
    finally:
        await engine.close()


async def test_a_cancelled_exchange_leaves_no_reply_for_the_next(standalone_url: str) -> None:
    """A call cut off while its reply is pending closes its connection: the next call on
    the lane reads its own reply, not the late one."""
    engine = await Engine.connect(Settings(redis_url=standalone_url))
    lane = engine.store.lane
    assert lane is not None
    try:
        blocking = _packed("BLPOP", "tw-lane-nokey", 1)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(lane.exchange(blocking, 1), 0.1)
        assert await lane.exchange(_packed("ECHO", "hi"), 1) == [b"hi"]
        await asyncio.sleep(1.1)  # the BLPOP's timeout passes: still nothing stray
        assert await lane.exchange(_packed("ECHO", "ho"), 1) == [b"ho"]
    finally:
        await engine.close()


async def test_concurrent_writes_take_more_connections_and_keep_a_few(
    standalone_url: str,
) -> None:
    engine = await Engine.connect(Settings(redis_url=standalone_url))
    lane = engine.store.lane
    assert lane is not None
    try:
        news = [NewTask(tenant="t", delay_ms=60_000, payload_json=str(i)) for i in range(20)]
        results = await asyncio.gather(*(engine.tasks.create(n) for n in news))
        assert all(r.created for r in results)
        assert len({r.task_id for r in results}) == 20
        assert [r.task.payload_json for r in results] == [str(i) for i in range(20)]
        assert 1 <= len(lane._idle) <= lane.keep
        pool = lane.pool
        assert len(pool._in_use_connections) == len(lane._idle)  # the rest went back
    finally:
        await engine.close()


async def test_a_script_error_reply_is_raised_as_it_was(standalone_url: str) -> None:
    """A script's 'timewheel:' error (malformed input) comes out of Store.write as the
    ResponseError redis-py raised for it, and any other failure as RedisUnavailable."""
    engine = await Engine.connect(Settings(redis_url=standalone_url))
    store = engine.store
    try:
        no_groups = Call(
            store.scripts.task_create,
            [store.keys.meta(0), store.keys.events(0)],
            store.shared(0, None),
            lambda reply: reply,
        )
        with pytest.raises(ResponseError, match="timewheel: create takes"):
            await store.write(no_groups)
        assert (await engine.tasks.create(NewTask(tenant="t", delay_ms=1000))).created
    finally:
        await engine.close()


async def test_a_write_to_a_dead_server_is_redis_unavailable(own_redis: RedisServer) -> None:
    engine = await Engine.connect(Settings(redis_url=own_redis.url))
    try:
        await engine.tasks.create(NewTask(tenant="t", delay_ms=60_000))
        await asyncio.to_thread(own_redis.kill)
        with pytest.raises(RedisUnavailable):
            await engine.tasks.create(NewTask(tenant="t", delay_ms=60_000))
    finally:
        await engine.close()


async def test_a_server_without_the_library_gets_it_on_a_lane_write(
    standalone_url: str,
) -> None:
    engine = await Engine.connect(Settings(redis_url=standalone_url))
    try:
        await engine.tasks.create(NewTask(tenant="t", delay_ms=60_000))
        await engine.client.execute_command("FUNCTION", "FLUSH")
        result = await engine.tasks.create(NewTask(tenant="t", delay_ms=60_000))
        assert (await engine.tasks.get("t", result.task_id)).state == "scheduled"
    finally:
        await engine.close()


async def test_a_reply_later_than_the_deadline_is_a_timeout_and_the_connection_is_dropped(
    standalone_url: str,
) -> None:
    """Redis busy past the lane's deadline (a script running on another connection): the
    exchange raises TimeoutError about when the deadline passes, its connection is
    closed, and the next exchange reads its own reply, not the late one."""
    engine = await Engine.connect(Settings(redis_url=standalone_url))
    lane = engine.store.lane
    assert lane is not None
    lane._deadlines = Deadlines(0.3, 0.05)  # 0.3 s, checked every 0.05 s
    other = aioredis.Redis.from_url(standalone_url)
    try:
        await lane.exchange(_packed("ECHO", "warm"), 1)
        busy_s = 1.5
        spin = (
            "local t = redis.call('TIME') local t0 = t[1] * 1e6 + t[2] "
            "repeat t = redis.call('TIME') until t[1] * 1e6 + t[2] - t0 > tonumber(ARGV[1])"
        )

        async def run_spin() -> None:
            await other.eval(spin, 0, str(int(busy_s * 1e6)))

        busy = asyncio.create_task(run_spin())
        await asyncio.sleep(0.1)  # the script runs
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await lane.exchange(_packed("ECHO", "late"), 1)
        elapsed = time.monotonic() - started
        assert 0.3 <= elapsed < busy_s  # the deadline, not the reply, ended it
        await busy
        assert await lane.exchange(_packed("ECHO", "next"), 1) == [b"next"]
    finally:
        await other.aclose()
        await engine.close()
