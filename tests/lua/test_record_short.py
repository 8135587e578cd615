"""What a record stores short (lua/lib/record.lua, store/record.py): the queue named
"default" as nil (1 byte, not 8), and the created time as created - due, a negative number
(5 bytes, not 9), when the run was created 1 ms to 2**31 ms before it is due. Every reader
gives them in full: GET, the tick's envelope and stream, acks, retries (which patch the
record's bytes and so take the created time again from the new due), dead letters,
usage, reschedules and the audit; a record written before, with both in full, reads and
moves the same way."""

from __future__ import annotations

from typing import Any

import msgpack

from timewheel.engine import Engine
from timewheel.runs.dead_letters import list_dead
from timewheel.runs.delivery import Delivery
from timewheel.runs.outcomes import Failure
from timewheel.store import record
from timewheel.tasks.model import NewTask
from timewheel.testing.audit import audit
from timewheel.testing.clock import NOW
from timewheel.testing.dispatch import prime, read_group, tick_all

GROUP = "g"
TENANT = "acme"
DAY = 86_400_000
PAYLOAD = '{"job":"eval"}'


def stored(raw: bytes) -> list[Any]:
    """The values as packed, without the reader's translation."""
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(raw)
    return list(unpacker)


async def body(engine: Engine, run_id: str) -> tuple[str, str]:
    shard = int(run_id[:3], 16)
    return (await engine.store.body_layout(shard)).place(engine.keys.tag(shard), run_id)


async def raw_record(engine: Engine, run_id: str) -> bytes:
    raw: Any = await engine.client.hget(*await body(engine, run_id))
    assert isinstance(raw, bytes)
    return raw


async def deliveries(engine: Engine, queue: str) -> list[Delivery]:
    return await read_group(engine, TENANT, GROUP, queue)


async def test_queue_and_created_are_stored_short_and_read_back_in_full(fast: Engine) -> None:
    engine = fast
    made = NOW - 1000
    await prime(engine, NOW)

    async def create(due: int, queue: str = "default") -> str:
        new = NewTask(tenant=TENANT, queue=queue, run_at_ms=due, payload_json=PAYLOAD)
        return (await engine.tasks.create(new, now_ms=made)).task_id

    plain = await create(NOW + 100)
    named = await create(NOW + 100, "emails")
    late = await create(made - 5_000)  # run_at in the past: due before created
    ahead = await create(made + 30 * DAY)  # past 2**31 ms
    v = {run_id: stored(await raw_record(engine, run_id)) for run_id in (plain, named, late, ahead)}
    assert v[plain][4] is None and v[named][4] == "emails"
    assert v[plain][5] == made - (NOW + 100) and v[named][5] == v[plain][5]
    assert v[late][5] == made and v[ahead][5] == made
    # Python's mirror of record_pack (the loaders' records) gives the same bytes
    for run_id, queue_name in ((plain, "default"), (named, "emails")):
        packed = record.pack_fresh(NOW + 100, TENANT, queue_name, made, PAYLOAD)
        assert await raw_record(engine, run_id) == packed
    full = len(msgpack.packb("default")) + len(msgpack.packb(made))
    short = len(msgpack.packb(None)) + len(msgpack.packb(-(2**31)))  # at most
    assert full - short == 11
    gap = len(msgpack.packb(made)) - len(msgpack.packb(v[plain][5]))
    assert len(await raw_record(engine, late)) - len(await raw_record(engine, plain)) == gap
    for run_id in (plain, named, late, ahead):
        task = await engine.tasks.get(TENANT, run_id)
        assert (
            task.created_ms == made
            and record.decode_fields(await raw_record(engine, run_id))[5] == made
        )
    assert (await engine.tasks.get(TENANT, plain)).queue == "default"

    # A record as earlier versions wrote it: queue and created in full.
    old = await create(NOW + 100)
    values = stored(await raw_record(engine, old))
    values[4], values[5] = "default", made
    await engine.client.hset(*await body(engine, old), b"".join(msgpack.packb(x) for x in values))

    # a reschedule packs the record again: created relative to the new due
    moved = await engine.tasks.update(TENANT, ahead, run_at_ms=NOW + 200, now_ms=NOW)
    assert moved.created_ms == made
    assert stored(await raw_record(engine, ahead))[5] == made - (NOW + 200)

    assert await tick_all(engine, NOW + 1000) == 5
    got = await deliveries(engine, "default")
    assert sorted(d.run_id for d in got) == sorted([plain, late, old, ahead])
    assert {d.queue for d in got} == {"default"}
    assert [d.run_id for d in await deliveries(engine, "emails")] == [named]
    assert (await audit(engine, NOW + 1000)).findings == []

    by_id = {d.run_id: d for d in got}
    # a retry patches the record's bytes: the queue's nil (or the old spelling) stays, and
    # a created time stored short is taken again from the new due; one in full stays so
    fails = [Failure(by_id[run_id], "RuntimeError: once") for run_id in (plain, late, old)]
    answers = await engine.outcomes.fail_many(fails, GROUP, now_ms=NOW + 1100)
    retried = dict(zip((plain, late, old), answers, strict=True))
    assert {r.outcome for r in retried.values()} == {"retry"}
    for run_id, queue, created in (
        (plain, None, "short"),
        (late, None, made),
        (old, "default", made),
    ):
        after = stored(await raw_record(engine, run_id))
        due = retried[run_id].due_ms
        assert due is not None and after[2] == due and after[1] == 1
        assert after[4] == queue
        assert after[5] == (made - due if created == "short" else created)
        assert (await engine.tasks.get(TENANT, run_id)).created_ms == made
    [buried] = await engine.outcomes.fail_many(
        [Failure(by_id[ahead], "ValueError: bad", permanent=True)], GROUP, now_ms=NOW + 1100
    )
    assert buried.outcome == "dead"
    dead = await engine.tasks.get(TENANT, ahead)
    assert (dead.state, dead.queue, dead.created_ms) == ("dead", "default", made)
    letters, _ = await list_dead(engine.store, TENANT)
    assert [(x.run_id, x.queue) for x in letters] == [(ahead, "default")]
    shard = int(plain[:3], 16)
    usage: Any = await engine.client.hgetall(engine.keys.usage(shard, TENANT))
    assert b"q:default" in usage and b"q:None" not in usage

    later = max(r.due_ms or 0 for r in retried.values()) + 1
    await prime(engine, later)
    assert await tick_all(engine, later) == 3
    again = await deliveries(engine, "default")
    assert sorted((d.run_id, d.attempt) for d in again) == sorted(
        (x, 2) for x in (plain, late, old)
    )
    assert await engine.outcomes.ack_many(again, GROUP, now_ms=later + 100) == [True] * 3
    for run_id in (plain, late, old):
        done = await engine.tasks.get(TENANT, run_id)
        assert (done.state, done.queue, done.created_ms) == ("succeeded", "default", made)
    assert stored(await raw_record(engine, plain))[4] is None
    assert (await audit(engine, later + 100)).findings == []


async def test_a_retry_patches_the_record_of_a_tenant_with_a_long_name(fast: Engine) -> None:
    """Tenant names of 32 bytes or more take a two-byte msgpack header: the retry's patch
    finds the created time past it."""
    engine = fast
    tenant = "tenant-with-a-name-of-forty-characters-x"
    assert len(tenant) == 40
    made = NOW - 1000
    await prime(engine, NOW)
    new = NewTask(tenant=tenant, run_at_ms=NOW + 100, payload_json=PAYLOAD)
    run_id = (await engine.tasks.create(new, now_ms=made)).task_id
    assert await raw_record(engine, run_id) == record.pack_fresh(
        NOW + 100, tenant, "default", made, PAYLOAD
    )
    assert await tick_all(engine, NOW + 1000) == 1
    [d] = await read_group(engine, tenant, GROUP)
    [retried] = await engine.outcomes.fail_many([Failure(d, "boom")], GROUP, now_ms=NOW + 1100)
    assert retried.outcome == "retry" and retried.due_ms is not None
    after = stored(await raw_record(engine, run_id))
    assert after[2:7] == [retried.due_ms, tenant, None, made - retried.due_ms, PAYLOAD]
    task = await engine.tasks.get(tenant, run_id)
    assert (task.tenant, task.created_ms, task.attempt, task.last_error) == (
        tenant,
        made,
        1,
        "boom",
    )
