"""A far bucket that fills splits into children (lua/lib/wheel.lua), so however many runs
of one shard fall in one bucket, every hash of the far level stays a listpack. Runs in the
children are found by GET and the list (store/keys.py bucket_path agrees with the
library's wheel_path), taken out by cancel and update, judged sound by the audit, and
promoted and sent exactly once."""

from __future__ import annotations

from collections import Counter

from timewheel.engine import Engine
from timewheel.runs.worker import Worker
from timewheel.tasks import listing as tasklist
from timewheel.tasks.model import NewTask
from timewheel.testing.audit import audit
from timewheel.testing.clock import NOW
from timewheel.testing.dispatch import prime

SPLIT = 1_000
"""A far bucket's members before it splits (lua/lib/wheel.lua WHEEL_SPLIT)."""


async def far_buckets(engine: Engine, shard: int) -> dict[str, int]:
    """Each far bucket of the shard (name after 'w:') and its size."""
    tag = engine.keys.tag(shard)
    out = {}
    async for key in engine.client.scan_iter(match=f"{tag}w:*", count=1000):
        name = key.decode()[len(tag) + 2 :]
        out[name] = await engine.client.hlen(key)
        assert await engine.client.object("encoding", key) == b"listpack", name
    return out


async def create(engine: Engine, n: int, due: int) -> list[str]:
    ids: list[str] = []
    for i in range(0, n, 500):
        made = await engine.tasks.create_many(
            [NewTask(tenant="acme", run_at_ms=due) for _ in range(min(500, n - i))]
        )
        ids.extend(m.task_id for m in made)
    return ids


async def test_a_full_bucket_splits_and_every_run_is_found_moved_and_sent_once(
    engine: Engine,
) -> None:
    await prime(engine)
    shard = engine.store.shards_of("acme")[0]
    due = NOW + 30 * 60_000  # in the far level, one bucket
    start = due - due % engine.settings.bucket_ms
    ids = await create(engine, 20_000, due)

    buckets = await far_buckets(engine, shard)
    assert buckets[str(start)] == SPLIT
    by_level = Counter(name.count(":") and len(name.split(":")[1]) for name in buckets)
    assert by_level[0] == 1 and by_level[1] == 16 and by_level[2] > 0
    assert sum(buckets.values()) == 20_000
    assert all(size <= SPLIT for size in buckets.values())
    # Every bucket is in the wheel index, under the bucket's start.
    scored: list[tuple[bytes, float]] = await engine.client.zrange(  # type: ignore[assignment]
        engine.keys.wheel(shard), 0, -1, withscores=True
    )
    index = dict(scored)
    assert {name.encode() for name in buckets} == set(index)
    assert set(index.values()) == {float(start)}

    # Runs of every level read as scheduled, one by one and in a list's batch.
    sample = ids[:3] + ids[1_500:1_503] + ids[-3:]
    for run_id in sample:
        assert (await engine.tasks.get("acme", run_id)).state == "scheduled"
    listed, _ = await tasklist.list_tasks(engine.store, "acme", limit=1000)
    assert len(listed) == 1000 and {t.state for t in listed} == {"scheduled"}

    # Cancel and reschedule runs that sit in children; the rest stay where they are.
    cancelled = set(ids[1_000:1_100] + ids[-100:])
    for run_id in cancelled:
        await engine.tasks.cancel("acme", run_id, now_ms=NOW)
    moved = ids[5_000:5_100]
    later = due + 2 * engine.settings.bucket_ms
    for run_id in moved:
        await engine.tasks.update("acme", run_id, run_at_ms=later, now_ms=NOW)
    after = await far_buckets(engine, shard)
    later_start = str(later - later % engine.settings.bucket_ms)
    assert after[later_start] == len(moved)
    assert sum(after.values()) == 20_000 - len(cancelled)

    report = await audit(engine, NOW)
    assert report.clean, report.findings[:5]

    # Promote and send: every run left goes out once, no cancelled one does.
    worker = Worker(engine.store, "acme", "default")
    sent: Counter[str] = Counter()
    at = later + 1
    for _ in range(200):
        while (await engine.dispatch.promote(shard, now_ms=at, limit=5000)).more:
            pass
        dispatched = (await engine.dispatch.tick(shard, now_ms=at, limit=5000)).dispatched
        got = await worker.read(count=10_000, block_ms=10)
        sent.update(d.run_id for d in got)
        for d in got:
            await engine.outcomes.ack(d, "timewheel", now_ms=at)
        if not dispatched and not got:
            break
    assert set(sent) == set(ids) - cancelled
    assert max(sent.values()) == 1
    assert await far_buckets(engine, shard) == {}
    assert await engine.client.zcard(engine.keys.wheel(shard)) == 0


async def test_a_bucket_fills_within_one_call_and_the_rest_of_the_call_goes_to_children(
    engine: Engine,
) -> None:
    """A batch counts what it puts into a bucket (one HLEN per bucket and call), so the
    split falls where the bucket is full even in the middle of a call, and a bucket a call
    put into before is indexed once."""
    await prime(engine)
    shard = engine.store.shards_of("acme")[0]
    due = NOW + 30 * 60_000
    start = str(due - due % engine.settings.bucket_ms)
    ids = await create(engine, 700, due)  # 500, then 200: 700 in the bucket
    ids += await create(engine, 500, due)  # 300 more fill it, 200 go to children
    buckets = await far_buckets(engine, shard)
    assert buckets[start] == SPLIT
    assert sum(buckets.values()) == 1_200
    assert all(":" in name and len(name.split(":")[1]) == 1 for name in buckets if name != start)
    index = await engine.client.zrange(engine.keys.wheel(shard), 0, -1)
    assert sorted(index) == sorted(name.encode() for name in buckets)
    for run_id in ids[:3] + ids[-3:]:
        assert (await engine.tasks.get("acme", run_id)).state == "scheduled"
    report = await audit(engine, NOW)
    assert report.clean, report.findings[:5]
