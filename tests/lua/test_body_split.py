"""A shard's body hashes split as it grows (lua/lib/bodies.lua, store/bodies.py): a new
shard keeps its records in one hash, and each split gives one hash's records to two, so
every hash holds about BODY_LOAD records whatever the shard holds. Records are found where
Python and the library both place them, by GET, the list, cancel, update, the audit, a
snapshot's walk and the tick; a shard written by earlier versions (1,024 't:<xy>' hashes,
no layout in its meta) is read as it is and grows from there."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from typing import Any

import msgpack

from timewheel import ids
from timewheel.engine import Engine
from timewheel.runs.worker import Worker
from timewheel.store import record
from timewheel.store.bodies import WALK_END, BodyLayout
from timewheel.tasks import listing as tasklist
from timewheel.tasks.model import NewTask
from timewheel.testing.audit import audit
from timewheel.testing.clock import NOW
from timewheel.testing.dispatch import prime
from timewheel.types import text

LOAD = 64
"""Records per hash before the next split (lua/lib/bodies.lua BODY_LOAD)."""


async def create(engine: Engine, n: int, due: int, tenant: str = "acme") -> list[str]:
    out: list[str] = []
    for i in range(0, n, 500):
        made = await engine.tasks.create_many(
            [NewTask(tenant=tenant, run_at_ms=due) for _ in range(min(500, n - i))]
        )
        out.extend(m.task_id for m in made)
    return out


async def hashes(engine: Engine, shard: int) -> dict[str, int]:
    """Every body hash of the shard, by a walk of its layout, and its size."""
    layout = await engine.store.body_layout(shard)
    out = {}
    for h in layout.walk(engine.keys.tag(shard)):
        out[h.key] = await engine.client.hlen(h.key)
    return out


async def listed_all(engine: Engine, tenant: str, limit: int) -> list[str]:
    out: list[str] = []
    cursor = None
    for _ in range(10_000):
        page, cursor = await tasklist.list_tasks(engine.store, tenant, limit=limit, cursor=cursor)
        out.extend(t.id for t in page)
        if cursor is None:
            return out
    raise AssertionError("the listing did not end")


async def test_a_shard_grows_by_splits_and_every_record_is_found(engine: Engine) -> None:
    await prime(engine)
    shard = engine.store.shards_of("acme")[0]
    due = NOW + 30 * 60_000
    made = await create(engine, 5_000, due)

    layout = await engine.store.body_layout(shard)
    sizes = await hashes(engine, shard)
    # 5,000 records at 64 a hash: level 6 (64 hashes) and a part of its splits
    assert layout.bits == 6 and 64 + layout.split == -(-5_000 // LOAD)
    assert len(sizes) == 64 + layout.split
    assert sum(sizes.values()) == 5_000
    assert max(sizes.values()) < 4 * LOAD
    assert int(await engine.client.hget(engine.keys.meta(shard), "body_n") or 0) == 5_000
    for key in sizes:
        assert await engine.client.object("encoding", key) == b"listpack", key
    # nothing left in the hashes of the levels it went through
    tag = engine.keys.tag(shard)
    assert await engine.client.exists(f"{tag}t0:", f"{tag}t3:1", f"{tag}t5:0") == 0

    # Python places every record where the library put it
    for run_id in made[:50] + made[-50:]:
        key, field = layout.place(tag, run_id)
        assert await engine.client.hexists(key, field), run_id
        assert (await engine.tasks.get("acme", run_id)).state == "scheduled"
    assert sorted(await listed_all(engine, "acme", 700)) == sorted(made)

    cancelled = set(made[:100])
    for run_id in cancelled:
        await engine.tasks.cancel("acme", run_id, now_ms=NOW)
    for run_id in made[100:200]:
        await engine.tasks.update("acme", run_id, run_at_ms=due + 1, now_ms=NOW)
    report = await audit(engine, NOW)
    assert report.clean, report.findings[:5]

    worker = Worker(engine.store, "acme", "default")
    sent: Counter[str] = Counter()
    at = due + 2
    for _ in range(100):
        while (await engine.dispatch.promote(shard, now_ms=at, limit=5000)).more:
            pass
        dispatched = (await engine.dispatch.tick(shard, now_ms=at, limit=5000)).dispatched
        got = await worker.read(count=10_000, block_ms=10)
        sent.update(d.run_id for d in got)
        await engine.outcomes.ack_many(got, "timewheel", now_ms=at)
        if not dispatched and not got:
            break
    assert set(sent) == set(made) - cancelled
    assert max(sent.values()) == 1
    for run_id in made[200:210]:
        assert (await engine.tasks.get("acme", run_id)).state == "succeeded"

    # Past retention every record goes, and the count the layout keeps goes with them.
    gone = at + engine.settings.retention_ms + 10 * engine.settings.bucket_ms
    for _ in range(100):
        if not (await engine.dispatch.expire(shard, limit=1_000, now_ms=gone)).more:
            break
    assert sum((await hashes(engine, shard)).values()) == 0
    assert int(await engine.client.hget(engine.keys.meta(shard), "body_n") or 0) == 0


async def test_a_listing_misses_nothing_while_hashes_split_between_its_pages(
    engine: Engine,
) -> None:
    due = NOW + 30 * 60_000
    before = await create(engine, 1_000, due)
    shard = engine.store.shards_of("acme")[0]
    seen: list[str] = []
    cursor = None
    splits = 0
    for _ in range(1_000):
        page, cursor = await tasklist.list_tasks(engine.store, "acme", limit=40, cursor=cursor)
        seen.extend(t.id for t in page)
        if cursor is None:
            break
        was = await engine.store.body_layout(shard)
        await create(engine, 30, due)  # splits hashes the walk has and has not passed
        splits += (await engine.store.body_layout(shard)) != was
    assert cursor is None and splits > 3
    assert set(before) <= set(seen)
    assert len(seen) == len(set(seen))


async def test_python_and_the_library_agree_on_every_layout(engine: Engine) -> None:
    """A shard set at a layout by hand takes a create where store/bodies.py places it."""
    rng = random.Random(7)
    shard = engine.store.shards_of("acme")[0]
    meta, tag = engine.keys.meta(shard), engine.keys.tag(shard)
    for bits in (0, 1, 4, 5, 9, 10, 11, 14, 15, 19):
        split = rng.randrange(1 << bits)
        await engine.client.flushall()
        # settled, and far from its next split
        await engine.client.hset(
            meta, mapping={"body_bits": bits, "body_split": split, "body_n": 0}
        )
        layout = BodyLayout(bits, split)
        made = await create(engine, 40, NOW + 60_000)
        assert await engine.store.body_layout(shard) == layout
        for run_id in made:
            key, field = layout.place(tag, run_id)
            raw: Any = await engine.client.hget(key, field)
            assert isinstance(raw, bytes), (bits, split, run_id)
            assert record.decode(run_id, raw).tenant == "acme"
        if bits <= 11:  # a walk of every hash: 2,048 HKEYS at most
            walked = [
                h.run_id(shard, text(f))
                for h in layout.walk(tag)
                for f in await engine.client.hkeys(h.key)
            ]
            assert sorted(walked) == sorted(made), (bits, split)


async def test_a_shard_of_earlier_versions_is_read_as_it_is_and_grows_from_there(
    engine: Engine,
) -> None:
    """Records under 't:<xy>' with no layout in the shard's meta (as earlier versions
    wrote them): found by every reader; the first create takes their count and keeps
    level 10, and once past 64 a hash the shard splits on from there."""
    await prime(engine)
    shard = engine.store.shards_of("acme")[0]
    tag = engine.keys.tag(shard)
    due = NOW + 30 * 60_000
    legacy = BodyLayout()
    old: list[str] = []
    for i in range(300):
        run_id = ids.make_task_id(shard, ids.new_token())
        key, field = legacy.place(tag, run_id)
        assert key.startswith(tag + "t:") and len(key) == len(tag) + 4
        # a fresh record as lua/lib/record.lua packs it: state .. payload, no trailing nils
        raw = b"".join(msgpack.packb(v) for v in (0, 0, due + i, "acme", "default", NOW, "{}"))
        await engine.client.hset(key, field, raw)
        await engine.client.zadd(engine.keys.wheel(shard), {str(due - due % 600_000): due})
        await engine.client.hset(engine.keys.bucket(shard, due - due % 600_000), run_id[3:], "")
        old.append(run_id)
    assert await engine.client.hget(engine.keys.meta(shard), "body_bits") is None
    assert (await engine.tasks.get("acme", old[0])).due_ms == due

    new = await create(engine, 1, due)
    assert await engine.store.body_layout(shard) == BodyLayout(10, 0)
    assert await engine.client.hget(engine.keys.meta(shard), "body_n") == b"301"
    for run_id in old[:20]:
        assert (await engine.tasks.get("acme", run_id)).due_ms >= due

    # 1,024 hashes at 64 each: past 65,536 records level 10 starts to split (the count
    # is set near there rather than filled: a split moves what its hash holds)
    await engine.client.hset(engine.keys.meta(shard), "body_n", 65_500)
    more = await create(engine, 600, due)
    layout = await engine.store.body_layout(shard)
    assert layout.bits == 10 and layout.split > 0
    # hashes (10, v < split) are gone, their records in (11, v) and (11, v + 1,024)
    split = [legacy.at(tag, 0).key]  # (10, 0), 't:00', the first
    children = [key.decode() async for key in engine.client.scan_iter(match=f"{tag}t11:*")]
    assert children and await engine.client.exists(*split) == 0
    assert {key for key in children} <= {
        BodyLayout(11, 0).at(tag, p).key for p in range(0, WALK_END, WALK_END >> 11)
    }
    # A shard far past its load splits at most once per record a call adds, not all at
    # once (a shard an earlier release filled holds hundreds of records a hash).
    await engine.client.hset(engine.keys.meta(shard), "body_n", 10_000_000)
    before = await engine.store.body_layout(shard)
    more += await create(engine, 5, due)
    after = await engine.store.body_layout(shard)
    assert (after.bits, after.split) == (before.bits, before.split + 5)
    everything = old + new + more
    for run_id in rng_sample(everything, 200):
        assert (await engine.tasks.get("acme", run_id)).state == "scheduled", run_id
    assert len(await listed_all(engine, "acme", 5_000)) == len(everything)


def rng_sample(items: list[str], n: int) -> list[str]:
    return random.Random(3).sample(items, n)


def test_a_walk_covers_every_position_once_in_any_layout() -> None:
    rng = random.Random(11)
    for bits in range(0, 12):
        layout = BodyLayout(bits, rng.randrange(1 << bits))
        walked = list(layout.walk("{tw:0}:"))
        assert walked[0].position == 0 and walked[-1].next_position == WALK_END
        assert all(a.next_position == b.position for a, b in itertools.pairwise(walked))
        assert len({h.key for h in walked}) == len(walked) == (1 << bits) + layout.split
        # a task's hash is the one of the walk that holds its position
        for _ in range(200):
            run_id = ids.make_task_id(0, ids.new_token())
            key, _ = layout.place("{tw:0}:", run_id)
            at = layout.at("{tw:0}:", int(f"{_low(run_id):020b}"[::-1], 2))
            assert at.key == key


def _low(run_id: str) -> int:
    x = 0
    for c in run_id[-4:]:
        x = x * 32 + ids.ALPHABET.index(c)
    return x
