"""Distant buckets (lua/lib/wheel.lua): a run due more than a distant bucket's width past
promoted_until waits in a bucket 16 far buckets wide (an hour at least), so a shard whose
runs spread thin over days pays a key per ~16 far buckets, not per run. The promoter moves
a distant bucket's runs into their far buckets (the cascade) once its start is within one
width of the horizon. Runs there are found by GET and the list (store/keys.py far_path
agrees with the library), taken out by cancel and update, judged sound by the audit, and
sent once, at their time."""

from __future__ import annotations

from collections import Counter
from typing import Any

from timewheel.engine import Engine
from timewheel.runs.worker import Worker
from timewheel.store import deployment
from timewheel.store.bodies import BodyLayout
from timewheel.tasks import listing as tasklist
from timewheel.tasks.model import NewTask
from timewheel.testing.audit import audit
from timewheel.testing.clock import NOW
from timewheel.testing.dispatch import prime

HOUR = 3_600_000
WIDTH = HOUR
"""A distant bucket's width here: 16 far buckets of 2 s are less than the hour minimum."""


async def keys_of(engine: Engine, shard: int, prefix: str) -> dict[str, int]:
    tag = engine.keys.tag(shard)
    out = {}
    async for key in engine.client.scan_iter(match=f"{tag}{prefix}*", count=1000):
        out[key.decode()[len(tag) :]] = await engine.client.hlen(key)
    return out


async def test_runs_due_far_ahead_wait_in_distant_buckets_and_go_out_once(
    engine: Engine,
) -> None:
    await prime(engine)
    shard = engine.store.shards_of("acme")[0]
    # 10 runs in each of the next 12 hours past the second: the first two hours are in
    # reach of the far buckets, the rest in distant buckets.
    dues = [NOW + 2 * HOUR + h * HOUR + i * 60_000 for h in range(12) for i in range(10)]
    made = [
        (await engine.tasks.create(NewTask(tenant="acme", run_at_ms=due), now_ms=NOW)).task_id
        for due in dues
    ]
    distant = await keys_of(engine, shard, "wd:")
    far = await keys_of(engine, shard, "w:")
    assert sum(distant.values()) + sum(far.values()) == len(made)
    assert len(distant) >= 9 and sum(distant.values()) >= 90
    assert all(size == 10 for size in distant.values())  # an hour of runs each
    index: Any = await engine.client.zrange(engine.keys.distant(shard), 0, -1, withscores=True)
    assert {f"wd:{name.decode()}" for name, _ in index} == set(distant)
    assert all(int(name) == int(score) for name, score in index)

    # GET and the list read them as scheduled; cancel and update take them out
    for run_id in made[-3:]:
        assert (await engine.tasks.get("acme", run_id)).state == "scheduled"
    listed, _ = await tasklist.list_tasks(engine.store, "acme", limit=500)
    assert {t.id for t in listed} == set(made)
    assert {t.state for t in listed} == {"scheduled"}
    cancelled = set(made[-10:])  # the whole last hour: its distant bucket goes
    for run_id in cancelled:
        await engine.tasks.cancel("acme", run_id, now_ms=NOW)
    assert len(await keys_of(engine, shard, "wd:")) == len(distant) - 1
    moved = made[-20]
    await engine.tasks.update("acme", moved, run_at_ms=NOW + 5 * 60_000, now_ms=NOW)
    report = await audit(engine, NOW)
    assert report.clean, report.findings[:5]

    # Promote and tick through the hours: each run goes out once, at its time or later,
    # never before; the distant buckets are gone by the time their runs are due.
    worker = Worker(engine.store, "acme", "default")
    sent: Counter[str] = Counter()
    at = NOW
    end = max(dues) + HOUR
    while at <= end:
        while (res := await engine.dispatch.promote(shard, now_ms=at, limit=5000)).more:
            pass
        await engine.dispatch.tick(shard, now_ms=at, limit=5000)
        for d in await worker.read(count=1000, block_ms=1):
            assert d.due_ms <= at
            sent[d.run_id] += 1
            await engine.outcomes.ack(d, "timewheel", now_ms=at)
        wide: Any = await engine.client.zrange(engine.keys.distant(shard), 0, 0, withscores=True)
        if wide:
            assert wide[0][1] > at + engine.settings.horizon_ms  # cascaded before it is due
        at += 10 * 60_000
    assert set(sent) == set(made) - cancelled
    assert max(sent.values()) == 1
    assert await keys_of(engine, shard, "wd:") == {}
    assert res.cascaded == 0


async def test_a_run_in_a_distant_bucket_lost_from_its_index_is_found_and_repaired(
    engine: Engine,
) -> None:
    await prime(engine)
    shard = engine.store.shards_of("acme")[0]
    due = NOW + 10 * HOUR
    made = await engine.tasks.create(NewTask(tenant="acme", run_at_ms=due), now_ms=NOW)
    start = due - due % WIDTH
    assert await engine.client.zrem(engine.keys.distant(shard), str(start)) == 1
    report = await audit(engine, NOW)
    assert {(f.kind.value, f.id) for f in report.findings} == {("not_in_wheel", made.task_id)}
    repaired = await audit(engine, NOW, repair=True)
    assert repaired.repairs
    assert (await audit(engine, NOW)).clean
    assert await engine.client.zscore(engine.keys.distant(shard), str(start)) == start


async def test_a_deployment_an_older_release_may_still_write_to_keeps_its_layout(
    engine: Engine,
) -> None:
    """Body hashes split and runs wait in distant buckets only once no other release's
    Function library is loaded (store/deployment.py): until then a shard keeps the 1,024
    hashes 't:<xy>' and far buckets, which every release reads."""
    c, k, settings = engine.client, engine.keys, engine.settings
    library = engine.store.scripts.library.name
    await c.flushall()
    await c.hset(k.layout(), mapping={"shards": settings.shards, "bucket_ms": settings.bucket_ms})
    await c.function_load(
        "#!lua name=timewheel_000000000000\n"
        "redis.register_function('tw_000000000000_noop', function() return 1 end)\n"
    )
    await deployment.ensure_layout(c, settings, library)
    assert await c.hget(k.layout(), "bodies") is None
    await prime(engine)
    shard = engine.store.shards_of("acme")[0]
    made = [
        await engine.tasks.create(NewTask(tenant="acme", run_at_ms=NOW + 10 * HOUR + i), now_ms=NOW)
        for i in range(100)
    ]
    assert await keys_of(engine, shard, "wd:") == {}
    assert sum((await keys_of(engine, shard, "w:")).values()) == 100
    assert await c.hget(k.meta(shard), "body_bits") is None  # not settled: level 10
    for m in made[:5]:
        key, _ = await engine.store.record_key(m.task_id)
        assert key == k.tag(shard) + "t:" + m.task_id[-2:]

    await c.function_delete("timewheel_000000000000")  # the rolling upgrade is done
    await deployment.ensure_layout(c, settings, library)
    assert await c.hget(k.layout(), "bodies") == b"split"
    assert await c.hget(k.meta(shard), "grow") == b"1"
    more = [
        await engine.tasks.create(NewTask(tenant="acme", run_at_ms=NOW + 10 * HOUR + i), now_ms=NOW)
        for i in range(100)
    ]
    assert sum((await keys_of(engine, shard, "wd:")).values()) == 100
    assert await engine.store.body_layout(shard) == BodyLayout(10, 0)  # kept its hashes
    for m in made + more:
        assert (await engine.tasks.get("acme", m.task_id)).state == "scheduled"
