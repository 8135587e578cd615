"""run_ack and run_fail take many runs of one shard in one call: each run is answered on
its own (acked, retried, buried, stale, not found) and fenced by its attempt; what a
batch shares (the entries' XACK and XDEL, the expiry index, the usage counts, the event
log entry) is written once and stays exact. Standalone and Cluster."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from typing import Any

import pytest

from timewheel.archive.events import batched_runs
from timewheel.archive.history import run_history
from timewheel.dispatch.tick import ExpireResult
from timewheel.engine import Engine
from timewheel.errors import TaskNotFound
from timewheel.runs.delivery import Delivery, parse_entry
from timewheel.runs.outcomes import Failure
from timewheel.store import record
from timewheel.tasks.model import NewTask
from timewheel.testing.clock import NOW
from timewheel.testing.dispatch import prime, read_group, tick_all
from timewheel.types import TaskState

GROUP = "g"
TENANT = "acme"


async def read_all(engine: Engine, tenants: tuple[str, ...] = (TENANT,)) -> list[Delivery]:
    """Dispatch every run due and read them all in the consumer group (so they are pending)."""
    await prime(engine, NOW)
    await tick_all(engine, NOW + 1000)
    out: list[Delivery] = []
    for tenant in tenants:
        out.extend(await read_group(engine, tenant, GROUP))
    return out


async def one_shard(engine: Engine, runs: int, payload: str = '"p"') -> list[Delivery]:
    """At least `runs` deliveries of one shard (the tenant's runs spread over several)."""
    await engine.tasks.create_many(
        [
            NewTask(tenant=TENANT, payload_json=payload, run_at_ms=NOW + 100)
            for _ in range(runs * 12)
        ]
    )
    delivered = await read_all(engine)
    shard, _ = Counter(engine.keys.shard_of_key(d.stream) for d in delivered).most_common(1)[0]
    mine = [d for d in delivered if engine.keys.shard_of_key(d.stream) == shard]
    assert len(mine) >= runs
    return mine


def unknown(d: Delivery) -> Delivery:
    """A delivery naming a run id of the same shard that has no record."""
    swap = "x" if d.run_id[5] != "x" else "y"
    return dataclasses.replace(d, run_id=d.run_id[:5] + swap + d.run_id[6:], entry_id="1-1")


async def events(engine: Engine, shard: int, kind: str) -> list[dict[bytes, bytes]]:
    entries: Any = await engine.client.xrange(engine.keys.events(shard))
    return [f for _, f in entries if f[b"e"] == kind.encode()]


async def usage(engine: Engine, shard: int) -> dict[str, int]:
    raw: Any = await engine.client.hgetall(engine.keys.usage(shard, TENANT))
    return {k.decode(): int(v) for k, v in raw.items()}


async def test_a_batch_of_acks_answers_each_run_and_writes_what_they_share_once(
    engine: Engine,
) -> None:
    d1, d2, d3, d4 = (await one_shard(engine, 4, payload='"four"'))[:4]
    shard = engine.keys.shard_of_key(d1.stream)
    before = await usage(engine, shard)
    assert await engine.outcomes.ack(d4, GROUP, now_ms=NOW + 1100)  # finished before the batch
    stale = dataclasses.replace(d3, attempt=d3.attempt + 1)  # an attempt that is not out
    batch = [d1, d2, d1, stale, d4, unknown(d1)]
    call = engine.outcomes.ack_call(batch, GROUP, now_ms=NOW + 1200)
    reply: Any = await engine.store.run(dataclasses.replace(call, decode=lambda r: r))
    assert [int(c) for c in reply] == [1, 1, 0, 0, 0, -1]
    for d, state in ((d1, "succeeded"), (d2, "succeeded"), (d3, "dispatched")):
        assert (await engine.tasks.get(TENANT, d.run_id)).state == state
    # Every entry named was acknowledged and deleted, the stale one's too (as before).
    pending: Any = await engine.client.xpending(d1.stream, GROUP)
    assert pending["pending"] == len(await read_left(engine, d1.stream))
    assert {d1.entry_id, d2.entry_id, d3.entry_id} & set(
        await read_left(engine, d1.stream)
    ) == set()
    # Usage: exactly the three runs acked (d4 alone, then d1 and d2) stop counting.
    after = await usage(engine, shard)
    assert after["q:default"] == before["q:default"] - 3
    assert after["bytes"] == before["bytes"] - 3 * len('"four"')
    # One event-log entry for the batch, naming each run acked once, with its tenant.
    [single, batched] = await events(engine, shard, "acked")
    assert [(r.run_id, r.tenant, r.attempt) for r in batched_runs("acked", batched)] == [
        (d1.run_id, TENANT, 1),
        (d2.run_id, TENANT, 1),
    ]
    assert int(batched[b"at"]) == NOW + 1200
    assert [r.run_id for r in batched_runs("acked", single)] == [d4.run_id]
    history = await run_history(engine.store, TENANT, d1.run_id)
    assert [(e.kind, e.attempt) for e in history][-1] == ("acked", 1)
    # Finished records are indexed for expiry, in the batch's finish bucket.
    bucket = (NOW + 1200) - (NOW + 1200) % engine.settings.bucket_ms
    retained: Any = await engine.client.lrange(engine.keys.retained(shard, bucket), 0, -1)
    assert {d1.run_id, d2.run_id} <= {k.decode() for k in retained}
    assert await engine.client.zscore(engine.keys.expiry(shard), bucket) == bucket
    # The same batch again: every run answers stale (or not found), nothing changes.
    assert await engine.outcomes.ack_many(batch, GROUP, now_ms=NOW + 1300) == [False] * 6
    assert await usage(engine, shard) == after
    assert len(await events(engine, shard, "acked")) == 2


async def read_left(engine: Engine, stream: str) -> list[str]:
    entries: Any = await engine.client.xrange(stream)
    return [eid.decode() for eid, _ in entries]


async def test_acks_of_many_shards_go_one_call_per_shard(engine: Engine) -> None:
    tenants = tuple(f"t{i}" for i in range(8))
    await engine.tasks.create_many(
        [NewTask(tenant=tenants[i % 8], payload_json="1", run_at_ms=NOW + 100) for i in range(40)]
    )
    delivered = await read_all(engine, tenants)
    shards = {engine.keys.shard_of_key(d.stream) for d in delivered}
    assert len(shards) > 1
    assert await engine.outcomes.ack_many(delivered, GROUP, now_ms=NOW + 1200) == [True] * 40
    entries = 0
    for shard in shards:
        [entry] = await events(engine, shard, "acked")
        entries += len(batched_runs("acked", entry))
    assert entries == 40
    for d in delivered:
        assert (await engine.tasks.get(d.tenant, d.run_id)).state == "succeeded"


async def test_a_batch_of_failures_retries_buries_and_refuses_each_run_on_its_own(
    engine: Engine,
) -> None:
    d1, d2, d3, d4 = (await one_shard(engine, 4))[:4]
    shard = engine.keys.shard_of_key(d1.stream)
    stale = dataclasses.replace(d4, attempt=2)
    failures = [
        Failure(d1, "RuntimeError: one"),
        Failure(d2, "RuntimeError: two", delay_ms=5_000),
        Failure(d1, "again"),  # the same run, already retried in this call
        Failure(d3, "ValueError: bad", permanent=True),
        Failure(stale, "late"),
        Failure(unknown(d1), "gone"),
    ]
    call = engine.outcomes.fail_call(failures, GROUP, now_ms=NOW + 1200)
    reply: Any = await engine.store.run(dataclasses.replace(call, decode=lambda r: r))
    # One flat array: each run's code and detail in turn.
    assert [int(code) for code in reply[::2]] == [1, 1, 0, 2, 0, -1]
    assert int(reply[3]) == NOW + 1200 + 5_000
    assert [int(detail) for detail in reply[5::6]] == [0, 0]
    t1 = await engine.tasks.get(TENANT, d1.run_id)
    t2 = await engine.tasks.get(TENANT, d2.run_id)
    assert (t1.state, t1.attempt, t1.last_error) == ("scheduled", 1, "RuntimeError: one")
    assert (t2.state, t2.due_ms) == ("scheduled", NOW + 6_200)
    assert (await engine.tasks.get(TENANT, d3.run_id)).state == "dead"
    assert (await engine.tasks.get(TENANT, d4.run_id)).state == "dispatched"
    dead: Any = await engine.client.xrange(engine.keys.dead(shard, TENANT))
    assert [f[b"run_id"].decode() for _, f in dead] == [d3.run_id]
    # One retry_scheduled entry for both retries, each with its own error and due time.
    [retried] = await events(engine, shard, "retry_scheduled")
    assert json.loads(retried[b"errors"]) == ["RuntimeError: one", "RuntimeError: two"]
    runs = batched_runs("retry_scheduled", retried)
    assert [(r.run_id, r.tenant, r.attempt, r.error) for r in runs] == [
        (d1.run_id, TENANT, 1, "RuntimeError: one"),
        (d2.run_id, TENANT, 1, "RuntimeError: two"),
    ]
    assert runs[1].due_ms == NOW + 6_200
    [buried] = await events(engine, shard, "dead")
    assert buried[b"id"].decode() == d3.run_id
    history = await run_history(engine.store, TENANT, d2.run_id)
    assert [(e.kind, e.error) for e in history][-1] == ("retry_scheduled", "RuntimeError: two")
    # The retries go out again at their next attempt, and their acks are fenced by it.
    await prime(engine, NOW + 1_000_000)
    await tick_all(engine, NOW + 1_000_000)
    again: Any = await engine.client.xreadgroup(GROUP, "c", {d1.stream: ">"}, count=100)
    redelivered = [parse_entry(d1.stream, eid, f) for eid, f in again[0][1]]
    assert sorted((d.run_id, d.attempt) for d in redelivered) == sorted(
        [(d1.run_id, 2), (d2.run_id, 2)]
    )
    late = dataclasses.replace(redelivered[0], attempt=1)
    assert await engine.outcomes.ack_many([late, *redelivered], GROUP) == [False, True, True]


async def test_retries_with_one_error_share_it_and_usage_stays_until_buried(
    engine: Engine,
) -> None:
    d1, d2 = (await one_shard(engine, 2))[:2]
    shard = engine.keys.shard_of_key(d1.stream)
    before = await usage(engine, shard)
    results = await engine.outcomes.fail_many(
        [Failure(d1, "TimeoutError: slow"), Failure(d2, "TimeoutError: slow")],
        GROUP,
        now_ms=NOW + 1200,
    )
    assert [r.outcome for r in results] == ["retry", "retry"]
    [retried] = await events(engine, shard, "retry_scheduled")
    assert retried[b"error"] == b"TimeoutError: slow" and b"errors" not in retried
    assert await usage(engine, shard) == before  # a retried run still counts


async def test_a_late_ack_in_a_batch_ends_the_run_whose_retry_waits_in_the_wheel(
    engine: Engine,
) -> None:
    d1, d2, d3 = (await one_shard(engine, 3))[:3]
    shard = engine.keys.shard_of_key(d1.stream)
    [retry] = await engine.outcomes.fail_many(
        [Failure(d1, "lease lost", delay_ms=0)], GROUP, now_ms=NOW + 1100
    )
    assert retry.outcome == "retry"
    near = engine.keys.tag(shard) + f"near:{TENANT}"
    assert await engine.client.zscore(near, d1.run_id) is not None  # waits in the near level
    # The attempt that was given up on reports success after all, beside two others.
    answers = await engine.outcomes.ack_many([d2, d1, d3, d1], GROUP, now_ms=NOW + 1200)
    assert answers == [True, True, True, False]
    assert (await engine.tasks.get(TENANT, d1.run_id)).state == "succeeded"
    assert await engine.client.zscore(near, d1.run_id) is None  # the retry is dropped
    assert await tick_all(engine, NOW + 10_000) == 0


REPACK = "return cmsgpack.pack(cmsgpack.unpack(ARGV[1]))"
"""A record decoded and packed again on the server: what a full rewrite would store."""


async def stored(engine: Engine, shard: int, run_id: str) -> bytes:
    raw: Any = await engine.client.hget(*(await engine.store.record_key(run_id)))
    return bytes(raw)


async def test_an_ack_writes_the_record_a_full_rewrite_would(engine: Engine) -> None:
    """The ack patches a first finish in place (state, attempt, updated appended) and
    packs any other record whole: either way the stored bytes are the canonical packing
    of the finished record, with every other field as it was."""
    await engine.tasks.create_many(
        [
            NewTask(
                tenant=TENANT,
                payload_json='"p"',
                run_at_ms=NOW + 100,
                options={"visibility_timeout_s": 60} if i % 2 else {},
            )
            for i in range(48)
        ]
    )
    delivered = await read_all(engine)
    shard, _ = Counter(engine.keys.shard_of_key(d.stream) for d in delivered).most_common(1)[0]
    mine = [d for d in delivered if engine.keys.shard_of_key(d.stream) == shard]
    plain = [d for d in mine if d.visibility_timeout_ms is None]
    with_opts = [d for d in mine if d.visibility_timeout_ms is not None]
    assert plain and with_opts
    # One run retried and out again: its record holds updated and last_error.
    retried = mine[0]
    await engine.outcomes.fail_many(
        [Failure(retried, "boom", delay_ms=0)], GROUP, now_ms=NOW + 1100
    )
    await tick_all(engine, NOW + 1150)
    again: Any = await engine.client.xreadgroup(GROUP, "c", {retried.stream: ">"}, count=10)
    [second] = [parse_entry(retried.stream, e, f) for e, f in again[0][1]]
    assert (second.run_id, second.attempt) == (retried.run_id, 2)
    batch = [second, *[d for d in mine if d.run_id != retried.run_id]]
    before = {
        d.run_id: record.decode_fields(await stored(engine, shard, d.run_id), sent=True)
        for d in batch
    }
    assert await engine.outcomes.ack_many(batch, GROUP, now_ms=NOW + 1200) == [True] * len(batch)
    for d in batch:
        raw = await stored(engine, shard, d.run_id)
        key, _ = await engine.store.record_key(d.run_id)
        repacked: Any = await engine.client.eval(REPACK, 1, key, raw)
        assert raw == bytes(repacked), d.run_id
        values = record.decode_fields(raw)
        expected = list(before[d.run_id])
        expected[0], expected[8] = TaskState.SUCCEEDED, NOW + 1200
        assert values == expected
    assert before[second.run_id][9] == "boom" and before[second.run_id][1] == 2


async def test_finished_runs_expire_in_bounded_calls_from_lists_and_older_hash_buckets(
    engine: Engine,
) -> None:
    """A finish bucket is a list of run ids, drained a limit at a time; a bucket an
    earlier version kept as a hash (run id -> '') is drained as well, also when a list
    shares its start; the index empties with them, and a record that is live again stays."""
    mine = await one_shard(engine, 8)
    shard = engine.keys.shard_of_key(mine[0].stream)
    bucket_ms, client = engine.settings.bucket_ms, engine.client
    acked, old, back = mine[:5], mine[5:7], mine[7]
    assert await engine.outcomes.ack_many(acked, GROUP, now_ms=NOW + 1200) == [True] * 5
    assert await engine.outcomes.ack_many([*old, back], GROUP, now_ms=NOW + 1200) == [True] * 3
    bucket = (NOW + 1200) - (NOW + 1200) % bucket_ms
    listed: Any = await client.lrange(engine.keys.retained(shard, bucket), 0, -1)
    assert [r.decode() for r in listed] == [d.run_id for d in (*acked, *old, back)]
    # As an earlier version indexed them: old in a hash of the same bucket, back in a
    # hash of the bucket before, alone.
    earlier = bucket - bucket_ms
    for d in (*old, back):
        await client.lrem(engine.keys.retained(shard, bucket), 1, d.run_id)
    await client.hset(
        engine.keys.legacy_retained(shard, bucket), mapping={d.run_id: "" for d in old}
    )
    await client.hset(engine.keys.legacy_retained(shard, earlier), back.run_id, "")
    await client.zadd(engine.keys.expiry(shard), {str(earlier): earlier})
    # back went out again meanwhile (a replay would): its record is not finished.
    raw = await stored(engine, shard, back.run_id)
    await client.hset(
        *(await engine.store.record_key(back.run_id)),
        bytes([1]) + raw[1:],
    )
    after = NOW + engine.settings.retention_ms + 3 * bucket_ms
    assert await engine.dispatch.expire(shard, now_ms=NOW + engine.settings.retention_ms - 1) == (
        ExpireResult(0, False)
    )
    steps = []
    while True:
        result = await engine.dispatch.expire(shard, limit=2, now_ms=after)
        steps.append(result.deleted)
        if not result.more:
            break
    assert sum(steps) == 8 and max(steps) == 2
    for d in (*acked, *old):
        with pytest.raises(TaskNotFound):
            await engine.tasks.get(TENANT, d.run_id)
    assert (await engine.tasks.get(TENANT, back.run_id)).state == "dispatched"
    assert await client.zcard(engine.keys.expiry(shard)) == 0
    for key in (
        engine.keys.retained(shard, bucket),
        engine.keys.legacy_retained(shard, bucket),
        engine.keys.legacy_retained(shard, earlier),
    ):
        assert not await client.exists(key)


async def test_a_retry_writes_the_record_a_full_rewrite_would(engine: Engine) -> None:
    """A retry patches state, attempt, due, updated and error into the stored record and
    keeps the rest as it is: the stored bytes are the canonical packing of the record a
    full rewrite would store, for a first failure (with and without opts), a second one
    (updated and error replaced) and a record with values past the error (kept)."""
    await engine.tasks.create_many(
        [
            NewTask(
                tenant=TENANT,
                payload_json='"p"',
                run_at_ms=NOW + 100,
                options={"visibility_timeout_s": 60} if i % 2 else {},
            )
            for i in range(48)
        ]
    )
    delivered = await read_all(engine)
    shard, _ = Counter(engine.keys.shard_of_key(d.stream) for d in delivered).most_common(1)[0]
    mine = [d for d in delivered if engine.keys.shard_of_key(d.stream) == shard]
    assert any(d.visibility_timeout_ms is None for d in mine)
    assert any(d.visibility_timeout_ms is not None for d in mine)
    # One record carries a dead letter id after nils for opts, updated, error, schedule,
    # as a record packed with its nils would: the retry keeps what follows the error.
    tailed = next(d for d in mine if d.visibility_timeout_ms is None)
    key, field = await engine.store.record_key(tailed.run_id)
    raw = await stored(engine, shard, tailed.run_id)
    await engine.client.hset(key, field, raw + b"\xc0\xc0\xc0\xc0\xa31-1")

    async def check(batch: list[Delivery], now: int, error: str) -> None:
        before = {
            d.run_id: record.decode_fields(await stored(engine, shard, d.run_id), sent=True)
            for d in batch
        }
        results = await engine.outcomes.fail_many(
            [Failure(d, error, delay_ms=10) for d in batch], GROUP, now_ms=now
        )
        assert [r.outcome for r in results] == ["retry"] * len(batch)
        for d in batch:
            raw = await stored(engine, shard, d.run_id)
            key, _ = await engine.store.record_key(d.run_id)
            repacked: Any = await engine.client.eval(REPACK, 1, key, raw)
            assert raw == bytes(repacked), d.run_id
            expected = list(before[d.run_id])
            expected[0], expected[2], expected[8], expected[9] = (
                TaskState.SCHEDULED,
                now + 10,
                now,
                error,
            )
            assert record.decode_fields(raw) == expected, d.run_id

    await check(mine, NOW + 1200, "RuntimeError: first")
    assert record.decode_fields(await stored(engine, shard, tailed.run_id))[11] == "1-1"
    # Out again at attempt 2, failed again: updated and error are replaced.
    await tick_all(engine, NOW + 1300)
    again: list[Delivery] = []
    for stream in {d.stream for d in mine}:
        reply: Any = await engine.client.xreadgroup(GROUP, "c", {stream: ">"}, count=1000)
        for _, entries in reply or []:
            again.extend(parse_entry(stream, eid, f) for eid, f in entries)
    assert sorted(d.run_id for d in again) == sorted(d.run_id for d in mine)
    assert {d.attempt for d in again} == {2}
    await check(again, NOW + 1400, "ValueError: a longer second error than the first one")
