"""The core engine on real Redis, standalone and Cluster: state rules, wheel, clock, fairness."""

from __future__ import annotations

import pytest
from redis.asyncio.cluster import RedisCluster

from timewheel.engine import Engine
from timewheel.errors import InvalidState, PayloadTooLarge, TaskNotFound, ValidationError
from timewheel.ids import shard_of
from timewheel.models import LAG_BUCKETS_MS
from timewheel.runs.worker import Worker
from timewheel.store.bodies import BodyLayout
from timewheel.store.keys import Keys
from timewheel.tasks.listing import list_tasks
from timewheel.tasks.model import NewTask
from timewheel.testing.clock import NOW
from timewheel.testing.dispatch import all_deliveries, prime, tick_all


async def test_create_then_get_returns_the_stored_task(engine: Engine) -> None:
    res = await engine.tasks.create(
        NewTask(
            tenant="acme",
            queue="emails",
            payload_json='{"to":"a@b.c"}',
            run_at_ms=NOW + 5000,
            options={"retry": {"max_attempts": 5}},
        ),
        now_ms=NOW,
    )
    assert res.created
    task = await engine.tasks.get("acme", res.task_id)
    assert (task.state, task.attempt, task.due_ms, task.queue) == (
        "scheduled",
        0,
        NOW + 5000,
        "emails",
    )
    assert task.payload == {"to": "a@b.c"}
    assert task.options == {"retry": {"max_attempts": 5}}
    assert task.created_ms == NOW
    assert shard_of(res.task_id) in engine.store.shards_of("acme")


async def test_delay_is_measured_on_the_shard_clock(engine: Engine) -> None:
    res = await engine.tasks.create(NewTask(tenant="acme", delay_ms=1500), now_ms=NOW)
    assert (await engine.tasks.get("acme", res.task_id)).due_ms == NOW + 1500


async def test_another_tenant_gets_not_found_like_an_unknown_id(engine: Engine) -> None:
    res = await engine.tasks.create(NewTask(tenant="acme", run_at_ms=NOW), now_ms=NOW)
    for call in (
        engine.tasks.get("other", res.task_id),
        engine.tasks.cancel("other", res.task_id),
        engine.tasks.update("other", res.task_id, delay_ms=5),
    ):
        with pytest.raises(TaskNotFound):
            await call
    for unknown in ("nope", "000zzzzzzzzzzzzz", "fff0000000000000"):
        with pytest.raises(TaskNotFound):
            await engine.tasks.get("acme", unknown)


async def test_cancel_only_while_scheduled(engine: Engine) -> None:
    await prime(engine)
    res = await engine.tasks.create(NewTask(tenant="acme", run_at_ms=NOW + 100), now_ms=NOW)
    cancelled = await engine.tasks.cancel("acme", res.task_id, now_ms=NOW)
    assert cancelled.state == "cancelled"
    with pytest.raises(InvalidState) as info:
        await engine.tasks.cancel("acme", res.task_id, now_ms=NOW)
    assert info.value.state == "cancelled"
    assert await tick_all(engine, NOW + 1000) == 0  # a cancelled task never dispatches
    assert (await engine.tasks.get("acme", res.task_id)).state == "cancelled"


async def test_cancel_and_reschedule_are_refused_after_dispatch(engine: Engine) -> None:
    await prime(engine)
    res = await engine.tasks.create(NewTask(tenant="acme", run_at_ms=NOW + 100), now_ms=NOW)
    assert await tick_all(engine, NOW + 100) == 1
    with pytest.raises(InvalidState) as info:
        await engine.tasks.cancel("acme", res.task_id)
    assert info.value.state == "dispatched"
    with pytest.raises(InvalidState):
        await engine.tasks.update("acme", res.task_id, run_at_ms=NOW + 10_000)
    with pytest.raises(InvalidState):
        await engine.tasks.update("acme", res.task_id, payload_json='"new"')
    task = await engine.tasks.get("acme", res.task_id)
    assert (task.state, task.attempt, task.due_ms) == ("dispatched", 1, NOW + 100)


async def test_reschedule_moves_the_run_and_payload_change_keeps_time(engine: Engine) -> None:
    await prime(engine)
    near = await engine.tasks.create(NewTask(tenant="acme", run_at_ms=NOW + 500), now_ms=NOW)
    far = await engine.tasks.create(NewTask(tenant="acme", run_at_ms=NOW + 60_000), now_ms=NOW)
    # near -> far and far -> near: both levels of the wheel are left consistently.
    await engine.tasks.update("acme", near.task_id, run_at_ms=NOW + 30_000, now_ms=NOW)
    await engine.tasks.update(
        "acme", far.task_id, run_at_ms=NOW + 700, payload_json='{"v":2}', now_ms=NOW
    )
    changed = await engine.tasks.update("acme", far.task_id, payload_json='{"v":3}', now_ms=NOW)
    assert changed.due_ms == NOW + 700 and changed.payload == {"v": 3}
    assert await tick_all(engine, NOW + 600) == 0
    assert await tick_all(engine, NOW + 700) == 1
    assert (await engine.tasks.get("acme", far.task_id)).state == "dispatched"
    assert (await engine.tasks.get("acme", near.task_id)).state == "scheduled"
    for step in range(NOW + 2_000, NOW + 30_001, 2_000):
        await prime(engine, step)
    assert await tick_all(engine, NOW + 29_999) == 0
    assert await tick_all(engine, NOW + 30_000) == 1
    deliveries = await all_deliveries(engine)
    assert [d.payload for d in deliveries if d.run_id == far.task_id] == [{"v": 3}]


async def test_idempotent_create_returns_the_same_task(engine: Engine) -> None:
    first = await engine.tasks.create(
        NewTask(
            tenant="acme", payload_json='{"n":1}', run_at_ms=NOW + 5000, idempotency_key="order-7"
        ),
        now_ms=NOW,
    )
    again = await engine.tasks.create(
        NewTask(
            tenant="acme", payload_json='{"n":2}', run_at_ms=NOW + 9000, idempotency_key="order-7"
        ),
        now_ms=NOW + 10,
    )
    assert first.created and not again.created
    assert again.task_id == first.task_id
    assert again.task is not None and again.task.payload == {"n": 1}
    assert again.task.due_ms == NOW + 5000
    other_tenant = await engine.tasks.create(
        NewTask(tenant="globex", run_at_ms=NOW, idempotency_key="order-7"), now_ms=NOW
    )
    assert other_tenant.created and other_tenant.task_id != first.task_id


async def test_finished_tasks_still_dedupe_until_retention_expires(engine: Engine) -> None:
    await prime(engine)
    first = await engine.tasks.create(
        NewTask(tenant="acme", run_at_ms=NOW, idempotency_key="k"), now_ms=NOW
    )
    await engine.tasks.cancel("acme", first.task_id, now_ms=NOW)
    again = await engine.tasks.create(NewTask(tenant="acme", run_at_ms=NOW, idempotency_key="k"))
    assert not again.created and again.task is not None and again.task.state == "cancelled"
    retention = engine.settings.retention_ms
    for shard in range(engine.settings.shards):
        await engine.dispatch.expire(shard, now_ms=NOW + retention - 1)
    assert (await engine.tasks.get("acme", first.task_id)).state == "cancelled"
    for shard in range(engine.settings.shards):
        await engine.dispatch.expire(shard, now_ms=NOW + retention + 2 * engine.settings.bucket_ms)
    with pytest.raises(TaskNotFound):
        await engine.tasks.get("acme", first.task_id)


async def test_tick_writes_the_full_envelope(engine: Engine) -> None:
    await prime(engine)
    res = await engine.tasks.create(
        NewTask(
            tenant="acme", queue="hooks", payload_json='{"url":"http://x"}', run_at_ms=NOW + 50
        ),
        now_ms=NOW,
    )
    assert await tick_all(engine, NOW + 49) == 0
    assert await tick_all(engine, NOW + 80) == 1
    [d] = await all_deliveries(engine)
    assert d.stream == Keys(engine.settings.prefix).stream(
        shard_of(res.task_id) or 0, "acme", "hooks"
    )
    assert (d.run_id, d.task_id, d.schedule_id) == (res.task_id, res.task_id, None)
    assert (d.tenant, d.queue, d.attempt) == ("acme", "hooks", 1)
    assert (d.due_ms, d.dispatched_ms) == (NOW + 50, NOW + 80)
    assert d.payload == {"url": "http://x"}


async def test_tick_counts_each_runs_lag_into_the_histogram_buckets(engine: Engine) -> None:
    await prime(engine, NOW - 200_000)
    lags = [0, 2, 3, 7, 30, 1000, 100_000]  # bounds are inclusive; 100 s is past them all
    for lag in lags:
        await engine.tasks.create(NewTask(tenant="acme", run_at_ms=NOW - lag), now_ms=NOW - 200_000)
    await prime(engine)
    counts = [0] * (len(LAG_BUCKETS_MS) + 1)
    total = 0
    for shard in range(engine.settings.shards):
        res = await engine.dispatch.tick(shard, now_ms=NOW)
        if not res.dispatched:
            assert res.lag_counts == [] and res.lag_sum_ms == 0
            continue
        assert len(res.lag_counts) == len(counts) and sum(res.lag_counts) == res.dispatched
        counts = [a + b for a, b in zip(counts, res.lag_counts, strict=True)]
        total += res.lag_sum_ms
    by_bound = dict(zip([*LAG_BUCKETS_MS, "inf"], counts, strict=True))
    assert by_bound == {**dict.fromkeys(by_bound, 0), 2: 2, 5: 1, 10: 1, 50: 1, 1000: 1, "inf": 1}
    assert total == sum(lags)


async def test_far_future_runs_wait_in_buckets_until_promoted(engine: Engine) -> None:
    await prime(engine)
    shard = engine.store.shards_of("acme")[0]
    k = engine.keys
    far_due = NOW + 20_000
    res = await engine.tasks.create(NewTask(tenant="acme", run_at_ms=far_due), now_ms=NOW)
    bucket = far_due - far_due % engine.settings.bucket_ms
    assert await engine.client.hexists(k.bucket(shard, bucket), k.bucket_member(res.task_id))
    assert await engine.client.zscore(k.near(shard, "acme"), res.task_id) is None
    # Before its bucket is within the horizon nothing moves; then it is promoted and due.
    assert (await engine.dispatch.promote(shard, now_ms=far_due - 5_000)).moved == 0
    moved = await engine.dispatch.promote(shard, now_ms=far_due - engine.settings.horizon_ms)
    assert moved.moved == 1 and moved.promoted_until_ms > far_due
    assert await engine.client.exists(k.bucket(shard, bucket)) == 0
    assert await engine.client.zscore(k.near(shard, "acme"), res.task_id) == far_due
    assert (await engine.dispatch.tick(shard, now_ms=far_due - 1)).dispatched == 0
    assert (await engine.dispatch.tick(shard, now_ms=far_due)).dispatched == 1


async def test_a_herd_in_one_bucket_is_promoted_in_bounded_steps(engine: Engine) -> None:
    await prime(engine)
    shard = engine.store.shards_of("herd")[0]
    due = NOW + 40_000
    batch = [NewTask(tenant="herd", run_at_ms=due) for _ in range(3000)]
    for i in range(0, len(batch), 500):
        await engine.tasks.create_many(batch[i : i + 500])
    # Past 1,000 members the bucket splits into children (lua/lib/wheel.lua), each a
    # listpack, which HSCAN answers whole: a step moves at most limit + 1,000.
    tag = engine.keys.tag(shard)
    buckets = [key async for key in engine.client.scan_iter(match=f"{tag}w:*", count=1000)]
    assert len(buckets) > 1
    for key in buckets:
        assert await engine.client.object("encoding", key) == b"listpack"
    steps = []
    while True:
        res = await engine.dispatch.promote(shard, now_ms=due - 1000, limit=400)
        steps.append(res.moved)
        if not res.more:
            break
    assert sum(steps) == 3000 and max(steps) <= 1400 and len(steps) >= 3
    dispatched = 0
    while (res2 := await engine.dispatch.tick(shard, now_ms=due, limit=1000)).dispatched:
        dispatched += res2.dispatched
    assert dispatched == 3000


async def test_clock_stepping_back_does_not_reopen_or_delay(engine: Engine) -> None:
    await prime(engine)
    shard = engine.store.shards_of("acme")[0]
    first = await engine.tasks.create(NewTask(tenant="acme", run_at_ms=NOW + 1000), now_ms=NOW)
    assert (await engine.dispatch.tick(shard, now_ms=NOW + 2000)).dispatched == 1
    # The clock steps back 1.5 s. A run due at NOW+1200 is due by the high-water mark:
    # it goes out now, not 1.5 s late; and the tick reports the step.
    late = await engine.tasks.create(NewTask(tenant="acme", run_at_ms=NOW + 1200), now_ms=NOW + 500)
    res = await engine.dispatch.tick(shard, now_ms=NOW + 500)
    assert res.clock_back_ms == 1500 and res.now_ms == NOW + 2000
    assert res.dispatched == 1
    # Nothing was dispatched twice, and the envelope carries the high-water-mark time.
    deliveries = await all_deliveries(engine)
    assert sorted(d.run_id for d in deliveries) == sorted([first.task_id, late.task_id])
    assert {d.dispatched_ms for d in deliveries} == {NOW + 2000}
    # A run due after the high-water mark still waits for the clock to reach it.
    later = await engine.tasks.create(
        NewTask(tenant="acme", run_at_ms=NOW + 2500), now_ms=NOW + 600
    )
    assert (await engine.dispatch.tick(shard, now_ms=NOW + 700)).dispatched == 0
    assert (await engine.tasks.get("acme", later.task_id)).state == "scheduled"


async def test_fair_tick_serves_a_small_tenant_before_a_backlog(engine: Engine) -> None:
    """50,000 runs of A and 100 of B due in the same second in the same shard."""
    await prime(engine)
    a, b = "tenant-a", None
    shard = engine.store.shards_of(a)[0]
    for i in range(1000):  # find a tenant name that lands in A's shard
        if engine.store.shards_of(f"tenant-b{i}")[0] == shard:
            b = f"tenant-b{i}"
            break
    assert b is not None
    due = NOW + 1000
    for i in range(0, 50_000, 2500):
        await engine.tasks.create_many(
            [NewTask(tenant=a, run_at_ms=due + (j % 1000)) for j in range(i, i + 2500)]
        )
    await engine.tasks.create_many([NewTask(tenant=b, run_at_ms=due + 999) for _ in range(100)])
    dispatched = {a: 0, b: 0}
    now = due + 999
    while True:
        res = await engine.dispatch.tick(shard, now_ms=now, limit=1000)
        if res.dispatched == 0:
            break
        counts = await _stream_lengths(engine, shard, a, b)
        dispatched = counts
        if dispatched[b] == 100:
            break
    assert dispatched[b] == 100
    assert dispatched[a] < 25_000, dispatched
    # And the backlog drains completely afterwards.
    while (await engine.dispatch.tick(shard, now_ms=now, limit=1000)).dispatched:
        pass
    assert await _stream_lengths(engine, shard, a, b) == {a: 50_000, b: 100}


async def _stream_lengths(engine: Engine, shard: int, *tenants: str) -> dict[str, int]:
    k = engine.keys
    return {t: int(await engine.client.xlen(k.stream(shard, t, "default"))) for t in tenants}


async def test_bad_input_is_refused_before_redis(engine: Engine) -> None:
    with pytest.raises(PayloadTooLarge):
        await engine.tasks.create(
            NewTask(
                tenant="acme",
                run_at_ms=NOW,
                payload_json='"' + "x" * engine.settings.max_payload_bytes + '"',
            )
        )
    with pytest.raises(ValidationError) as info:
        await engine.tasks.create(NewTask(tenant="bad tenant!", run_at_ms=NOW))
    assert info.value.field == "tenant"
    with pytest.raises(ValidationError) as info:
        await engine.tasks.create(NewTask(tenant="acme", queue="a:b", run_at_ms=NOW))
    assert info.value.field == "queue"
    with pytest.raises(ValidationError):
        await engine.tasks.create(NewTask(tenant="acme"))  # neither run_at nor delay


async def test_scripts_reload_after_the_server_forgets_them(engine: Engine) -> None:
    """A new or emptied server has no library: calls and pipelines load it and resend."""
    client = engine.client
    if isinstance(client, RedisCluster):
        for node in client.get_primaries():
            await client.execute_command("FUNCTION", "FLUSH", target_nodes=node)
    else:
        await client.execute_command("FUNCTION", "FLUSH")  # type: ignore[no-untyped-call]
    await prime(engine)
    many = await engine.tasks.create_many([NewTask(tenant="acme", run_at_ms=NOW) for _ in range(3)])
    one = await engine.tasks.create(NewTask(tenant="acme", run_at_ms=NOW), now_ms=NOW)
    assert all(r.created for r in [*many, one])
    assert await tick_all(engine, NOW) == 4


async def test_a_sent_run_is_dispatched_though_its_record_is_not_rewritten(engine: Engine) -> None:
    """The tick only takes a run out of the near level; every reader (Lua and Python)
    derives dispatched, at the next attempt, and the first write records what happened."""
    await prime(engine)
    keyed = NewTask(tenant="acme", run_at_ms=NOW, idempotency_key="k")
    ok = (await engine.tasks.create(keyed, now_ms=NOW)).task_id
    bad = (await engine.tasks.create(NewTask(tenant="acme", run_at_ms=NOW), now_ms=NOW)).task_id
    later = (
        await engine.tasks.create(NewTask(tenant="acme", run_at_ms=NOW + 60_000), now_ms=NOW)
    ).task_id
    shard = shard_of(ok)
    assert shard is not None
    stored = await engine.client.hget(*(await engine.store.record_key(ok)))
    assert await tick_all(engine, NOW) == 2
    assert await engine.client.hget(*(await engine.store.record_key(ok))) == stored
    for run in (ok, bad):
        task = await engine.tasks.get("acme", run)
        assert (task.state, task.attempt) == ("dispatched", 1)
    assert (await engine.tasks.get("acme", later)).state == "scheduled"
    listed, _ = await list_tasks(engine.store, "acme", state="dispatched")
    assert {t.id for t in listed} == {ok, bad}
    again = await engine.tasks.create(keyed, now_ms=NOW)  # the duplicate answers the run as it is
    assert again.task is not None and (again.task.state, again.task.attempt) == ("dispatched", 1)
    worker = Worker(engine.store, "acme", "default")
    deliveries = {d.task_id: d for d in await worker.read(block_ms=100)}
    assert await worker.ack(deliveries[ok])
    await worker.fail(deliveries[bad], "boom", permanent=True)
    assert (
        (await engine.tasks.get("acme", ok)).state,
        (await engine.tasks.get("acme", ok)).attempt,
    ) == (
        "succeeded",
        1,
    )
    assert (
        (await engine.tasks.get("acme", bad)).state,
        (await engine.tasks.get("acme", bad)).attempt,
    ) == (
        "dead",
        1,
    )


async def test_a_record_is_stored_under_its_id_less_what_the_key_implies(engine: Engine) -> None:
    res = await engine.tasks.create(NewTask(tenant="acme", delay_ms=60_000), now_ms=NOW)
    shard = shard_of(res.task_id)
    assert shard is not None
    layout = await engine.store.body_layout(shard)
    assert layout == BodyLayout(0, 0)  # a new shard's first record: one hash, 't0:'
    body, field = await engine.store.record_key(res.task_id)
    assert body == engine.keys.tag(shard) + "t0:"
    assert field == res.task_id[3:]
    assert await engine.client.hexists(body, field)
    hashed = next(layout.walk(engine.keys.tag(shard)))
    assert hashed.key == body and hashed.run_id(shard, field) == res.task_id
    run_id = f"{res.task_id}@1795979241606"
    assert layout.place("", run_id)[1] == field + "@1795979241606"
    assert hashed.run_id(shard, field + "@1795979241606") == run_id
