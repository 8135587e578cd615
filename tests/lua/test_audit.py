"""The audit against a real Redis, standalone and Cluster: a deployment broken on purpose
one way per kind is reported kind by kind and id by id, --repair mends what it may and
the next pass finds only the rest; lateness says why; a clean deployment under load
reports nothing."""

from __future__ import annotations

import asyncio
from collections import Counter

from timewheel.audit import AuditOptions, AuditPass
from timewheel.audit.calls import AuditCalls
from timewheel.audit.findings import Kind
from timewheel.dispatch.rates import DispatchRates
from timewheel.engine import Engine
from timewheel.runs.worker import Worker
from timewheel.schedules.model import NewSchedule
from timewheel.schedules.spec import ScheduleSpec
from timewheel.tasks.model import NewTask
from timewheel.testing.audit import audit, break_deployment, found
from timewheel.testing.clock import NOW
from timewheel.testing.dispatch import prime, tick_all
from timewheel.testing.settings import test_settings


async def test_a_fresh_deployment_is_clean(engine: Engine) -> None:
    await prime(engine)
    await engine.tasks.create_many(
        [NewTask(tenant=f"t{i % 3}", run_at_ms=NOW + i * 500) for i in range(40)]
    )
    await tick_all(engine, NOW + 5_000)
    report = await audit(engine, NOW + 5_000)
    assert report.clean, report.findings
    assert report.examined.records == 40
    assert report.examined.entries > 0 and report.examined.members > 0


async def test_each_fault_is_found_and_repair_leaves_only_what_it_may_not_touch(
    engine: Engine,
) -> None:
    faults = await break_deployment(engine)
    report = await audit(engine, faults.now_ms)
    assert found(report) == faults.expected
    assert report.total == len(faults.expected)

    repaired = await audit(engine, faults.now_ms, repair=True)
    assert found(repaired) == faults.expected
    assert all(sum(n.values()) == n.get("repaired") for n in repaired.repairs.values())

    after = await audit(engine, faults.now_ms)
    assert found(after) == faults.after_repair


async def test_repairs_put_runs_back_where_they_go_out_again(engine: Engine) -> None:
    faults = await break_deployment(engine, repairable_only=True)
    await audit(engine, faults.now_ms, repair=True)
    assert (await audit(engine, faults.now_ms)).clean
    ids = {kind: run_id for kind, run_id in faults.expected}
    lost = ids[Kind.NOT_IN_WHEEL.value]
    assert (await engine.tasks.get("acme", lost)).state == "scheduled"
    # The delivery its group lost is the reaper's again: it retries it as expired.
    unpending = ids[Kind.DELIVERED_NOT_PENDING.value]
    reaped = await engine.dispatch.reap(engine.store.locate(unpending), now_ms=faults.now_ms)
    assert reaped.retried == 1
    task = await engine.tasks.get("acme", unpending)
    assert (task.state, task.attempt) == ("scheduled", 1)
    # The runs whose delivery was lost are due again, and go out at their next attempt.
    sent = await tick_all(engine, faults.now_ms + 3_000)
    assert sent >= 2
    assert (await audit(engine, faults.now_ms + 3_000)).clean


def _tenants_of_distinct_shards(engine: Engine, count: int) -> list[str]:
    names: dict[int, str] = {}
    for i in range(10_000):
        name = f"tenant-{i}"
        names.setdefault(engine.store.shards_of(name)[0], name)
        if len(names) == count:
            break
    return list(names.values())


async def test_a_late_run_says_why_it_is_late(redis_url: str) -> None:
    engine = await Engine.connect(test_settings(redis_url, tick_batch=5))
    try:
        await prime(engine)
        unowned, owned, herd, slow = _tenants_of_distinct_shards(engine, 4)
        for tenant in (owned, herd, slow):  # a scheduler node holds these shards
            shard = engine.store.shards_of(tenant)[0]
            await engine.client.set(engine.keys.lease(shard), "node-a/1")
        counts = {unowned: 3, owned: 3, herd: 10, slow: 10}
        for tenant, n in counts.items():
            await engine.tasks.create_many(
                [NewTask(tenant=tenant, run_at_ms=NOW) for _ in range(n)]
            )
        far = await engine.tasks.create(NewTask(tenant=owned, run_at_ms=NOW + 600_000), now_ms=NOW)
        # One run of `slow` a hundred seconds: the tick sends one and holds the rest back.
        await DispatchRates.of(engine.store).put(slow, 0.01)
        assert (await engine.dispatch.tick(engine.store.shards_of(slow)[0], now_ms=NOW)).held

        report = await audit(engine, NOW + 61_000)
        reasons = Counter((f.tenant, f.reason) for f in report.findings if f.kind is Kind.OVERDUE)
        assert reasons == {
            (unowned, "unowned"): 3,
            (owned, "unknown"): 3,
            (herd, "backlog"): 10,
            (slow, "rate_held"): 9,
        }
        assert report.reasons[Kind.OVERDUE] == {
            "backlog": 10,
            "rate_held": 9,
            "unknown": 3,
            "unowned": 3,
        }
        assert (await audit(engine, NOW + 59_000)).clean  # under the threshold: not yet

        later = await audit(engine, NOW + 700_000)  # the promoter never moved `far`
        [late_far] = [f for f in later.findings if f.id == far.task_id]
        assert (late_far.kind, late_far.reason) == (Kind.OVERDUE, "unknown")
        assert "far level" in late_far.detail
    finally:
        await engine.close()


async def test_a_pending_entry_past_its_lease_and_the_grace_is_reported(fast: Engine) -> None:
    """visibility_timeout 1 s (the fast settings), grace 0: once idle past it, and no
    scheduler reaps the shard, the entry is reported, until the reaper takes it."""
    await prime(fast)
    created = await fast.tasks.create(NewTask(tenant="acme", run_at_ms=NOW), now_ms=NOW)
    await tick_all(fast, NOW)
    worker = Worker(fast.store, "acme", "default", consumer="gone")
    [delivery] = await worker.read(count=1, block_ms=10)
    assert (await audit(fast, NOW, lease_grace_ms=0)).clean
    await asyncio.sleep(1.1)
    report = await audit(fast, NOW, lease_grace_ms=0)
    assert found(report) == {(Kind.LEASE_EXPIRED_UNREAPED.value, created.task_id)}
    assert report.findings[0].reason == "unowned"
    assert "consumer gone" in report.findings[0].detail
    assert (await audit(fast, NOW, lease_grace_ms=5_000)).clean  # within the grace
    await fast.dispatch.reap(fast.store.locate(created.task_id), now_ms=NOW)
    assert (await audit(fast, NOW, lease_grace_ms=0)).clean
    assert delivery.attempt == 1


async def test_an_ended_schedule_needs_end_at_max_runs_or_no_fire_time_left(
    engine: Engine,
) -> None:
    await prime(engine)

    async def schedule(spec: ScheduleSpec, **kw: object) -> str:
        new = NewSchedule(tenant="acme", spec=spec, **kw)  # type: ignore[arg-type]
        sched, _ = await engine.schedules.create(new, now_ms=NOW)
        return sched.id

    ran_out = await schedule(ScheduleSpec(every_s=1), max_runs=2)
    ended_at = await schedule(ScheduleSpec(every_s=1, end_at_ms=NOW + 1_500))
    silent = await schedule(ScheduleSpec(every_s=60))
    shard = engine.store.locate(silent)

    async def stored_state(sid: str) -> bytes | str | None:
        return await engine.client.hget(engine.keys.schedule(shard, sid), "state")

    assert await stored_state(ran_out) == await stored_state(ended_at) == b"ended"
    assert (await audit(engine, NOW)).clean
    await engine.client.hset(engine.keys.schedule(shard, silent), "state", "ended")
    await engine.client.zrem(engine.keys.plan(shard, "acme"), silent)
    report = await audit(engine, NOW)
    assert found(report) == {(Kind.SCHEDULE_ENDED_SILENTLY.value, silent)}
    assert "fires again" in report.findings[0].detail


async def test_an_active_schedule_whose_next_fire_time_passed_unplanned_is_late(
    engine: Engine,
) -> None:
    await prime(engine)
    sched, _ = await engine.schedules.create(
        NewSchedule(tenant="acme", spec=ScheduleSpec(every_s=10)), now_ms=NOW
    )
    assert (await audit(engine, NOW + 30_000)).clean  # planned to NOW + 30 s, next at + 40 s
    report = await audit(engine, NOW + 200_000)
    [late] = [f for f in report.findings if f.kind is Kind.SCHEDULE_OVERDUE]
    assert (late.id, late.reason) == (sched.id, "unowned")
    assert f"{NOW + 40_000}" in late.detail
    await engine.planner.plan(engine.store.locate(sched.id), now_ms=NOW + 200_000)
    report = await audit(engine, NOW + 200_000)
    assert not [f for f in report.findings if f.kind is Kind.SCHEDULE_OVERDUE]


async def test_a_run_promoted_ahead_of_promoted_until_is_judged_by_its_stream(
    redis_url: str,
) -> None:
    """Past runs of a far bucket drained in bounded steps (a scheduler back after downtime)
    are in the near level, or sent, while promoted_until still lies before them: their
    records say scheduled though they are out. The audit tells them by their ready stream.
    A delivery whose outcome did not reach its record (the entry gone, the record still
    out) is reported, and --repair sends the run again."""
    engine = await Engine.connect(test_settings(redis_url, promote_batch=10))
    try:
        await prime(engine)
        due, herd = NOW + 10_000, 1_100  # past 1,024 a bucket is a hashtable: HSCAN steps
        for _ in range(herd // 100):
            await engine.tasks.create_many(
                [NewTask(tenant="acme", run_at_ms=due) for _ in range(100)]
            )
        shard = engine.store.shards_of("acme")[0]
        later = NOW + 20_000
        promoted = await engine.dispatch.promote(shard, now_ms=later)
        assert promoted.more and promoted.moved < herd
        assert (await engine.dispatch.tick(shard, now_ms=later)).dispatched == promoted.moved
        assert (await audit(engine, later)).clean  # some out, the rest in a level

        worker = Worker(engine.store, "acme", "default")
        [delivery] = await worker.read(count=1, block_ms=10)
        acked = await engine.outcomes.ack(delivery, "timewheel", now_ms=later)
        task = await engine.tasks.get("acme", delivery.run_id)
        report = await audit(engine, later)
        if acked and task.state == "succeeded":
            assert report.clean
            return
        # The entry is gone and the record never learnt the outcome: nothing would send
        # the run again. While promoted_until is before it, it reads as out of the wheel.
        assert found(report) == {(Kind.NOT_IN_WHEEL.value, delivery.run_id)}
        while (await engine.dispatch.promote(shard, now_ms=later)).more:
            pass
        report = await audit(engine, later)
        assert found(report) == {(Kind.DISPATCHED_WITHOUT_ENTRY.value, delivery.run_id)}
        await audit(engine, later, repair=True)
        assert (await audit(engine, later)).clean
        resent = 0
        while (tick := await engine.dispatch.tick(shard, now_ms=later + 5_000)).consumed:
            resent += tick.dispatched
        assert resent == herd - promoted.moved + 1  # the rest, and the lost one again
        again = await worker.read(count=herd, block_ms=10)
        assert delivery.run_id in {d.run_id for d in again}
    finally:
        await engine.close()


async def test_a_pass_in_small_steps_finds_what_a_whole_pass_finds(engine: Engine) -> None:
    """step(budget) does a bounded amount of work and keeps its cursors: a pass made of
    many small steps, as a scheduler node could run it, ends with the same findings."""
    faults = await break_deployment(engine)
    options = AuditOptions(now_ms=faults.now_ms, batch=3)
    stepped = AuditPass(engine.store, options, keep=1_000)
    steps = 0
    while not await stepped.step(5):
        steps += 1
        assert steps < 10_000
    report = stepped.report()
    assert found(report) == faults.expected
    assert steps > 10  # many calls, each of a few records, entries or members
    assert report.examined.records == (await audit(engine, faults.now_ms)).examined.records


async def test_a_stream_is_read_up_to_its_last_entry_when_its_reading_began(
    engine: Engine,
) -> None:
    """A stream that grows while it is read still ends: entries added after its reading
    began are of runs sent after the records were read, and are left to the next pass."""
    await prime(engine)
    await engine.tasks.create_many([NewTask(tenant="acme", run_at_ms=NOW) for _ in range(10)])
    await tick_all(engine, NOW)
    shard = engine.store.shards_of("acme")[0]
    stream = engine.keys.stream(shard, "acme", "default")
    calls = AuditCalls(engine.store, AuditOptions(batch=4))
    scratch = engine.keys.audit_scratch(shard, "test")
    step = await engine.store.run(calls.streams(shard, scratch, [stream], ""))
    assert (step.position, step.examined) == (0, 4)
    for _ in range(5):  # entries no run accounts for: read, they would be findings
        await engine.client.xadd(stream, {"run_id": "x", "attempt": "1"})
    read, findings = step.examined, list(step.findings)
    while step.position == 0:
        step = await engine.store.run(calls.streams(shard, scratch, [stream], step.cursor))
        read, findings = read + step.examined, findings + step.findings
    assert (read, findings) == (10, [])


async def test_a_stream_made_after_the_pass_listed_the_keys_is_not_judged_without_it(
    engine: Engine,
) -> None:
    """A pass reads the streams it listed when it began. A tenant's first runs sent after
    that are out in a stream the pass never reads: not judged (the next pass reads it),
    where a stream that is gone leaves its runs out with no entry anywhere."""
    await prime(engine)
    stepped = AuditPass(engine.store, AuditOptions(now_ms=NOW + 1_000), keep=1_000)
    while not stepped.discovery.done:
        await stepped.discovery.step()
    made = await engine.tasks.create_many([NewTask("late", run_at_ms=NOW) for _ in range(5)])
    assert await tick_all(engine, NOW + 1_000) == 5
    while not await stepped.step(100):
        pass
    report = stepped.report()
    assert report.clean, report.findings
    assert (await audit(engine, NOW + 1_000)).clean  # the next pass reads the stream

    shard = engine.store.shards_of("late")[0]
    await engine.client.delete(engine.keys.stream(shard, "late", "default"))
    gone = await audit(engine, NOW + 1_000)
    assert found(gone) == {("dispatched_without_entry", m.task_id) for m in made}
