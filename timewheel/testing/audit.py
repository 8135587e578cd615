"""Audits in tests: a pass at a given clock, its findings as (kind, id) pairs, and a
deployment broken on purpose, one way per kind of finding, with what an audit must find.

Faults are made with plain Redis commands, the way an operator's slip or a bug would
leave them: a deleted wheel member or record, an XDEL, an XACK that was not run_ack, a
corrupt record, a schedule taken out of its plan index.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from timewheel.audit import AuditOptions, AuditPass, AuditReport
from timewheel.audit.findings import REPAIRS, Kind
from timewheel.engine import Engine
from timewheel.runs.worker import Worker
from timewheel.schedules.model import NewSchedule
from timewheel.schedules.spec import ScheduleSpec
from timewheel.tasks.model import NewTask
from timewheel.testing.clock import NOW
from timewheel.testing.dispatch import prime, tick_all


async def audit(
    engine: Engine,
    now_ms: int | None = NOW,
    *,
    repair: bool = False,
    shards: list[int] | None = None,
    **options: Any,
) -> AuditReport:
    """One pass over the engine's deployment at shard clock `now_ms` (None: Redis TIME)."""
    opts = AuditOptions(now_ms=now_ms, **options)
    return await AuditPass(engine.store, opts, shards=shards, repair=repair, keep=100_000).run()


def found(report: AuditReport) -> set[tuple[str, str]]:
    """(kind, id) of every finding."""
    return {(f.kind.value, f.id) for f in report.findings}


@dataclass
class Faults:
    """A deployment broken on purpose: the findings an audit must report, and those that
    remain after `--repair` (the kinds that are reported only)."""

    expected: set[tuple[str, str]] = field(default_factory=set)
    now_ms: int = NOW + 1_000
    """The shard clock to audit at."""

    def expect(self, kind: Kind, run_id: str) -> None:
        self.expected.add((kind.value, run_id))

    @property
    def after_repair(self) -> set[tuple[str, str]]:
        return {(k, i) for k, i in self.expected if Kind(k) not in REPAIRS}


async def break_deployment(
    engine: Engine, *, repairable_only: bool = False, at_ms: int = NOW
) -> Faults:
    """Runs of tenants acme and beta at `at_ms` (a whole multiple of the bucket width),
    dispatched and delivered in part, then one fault of each kind (only those --repair
    mends, with `repairable_only`)."""
    faults = Faults(now_ms=at_ms + 1_000)
    c, k, now = engine.client, engine.keys, faults.now_ms
    await prime(engine, at_ms)
    shard = engine.store.shards_of("acme")[0]
    worker = Worker(engine.store, "acme", "default", consumer="w1")
    await worker.ensure_groups()

    async def task(tenant: str, due_ms: int) -> str:
        created = await engine.tasks.create(
            NewTask(tenant=tenant, run_at_ms=due_ms, payload_json='"x"'), now_ms=at_ms
        )
        return created.task_id

    near = [await task("acme", at_ms + 100 + i) for i in range(6)]
    late = await task("acme", at_ms + 3_000)  # near level, due after the tick below
    far_due = at_ms + 600_000
    far = [await task("acme", far_due + i) for i in range(5)]
    beta = [await task("beta", at_ms + 3_000 + i) for i in range(2)]
    spec = ScheduleSpec(every_s=1, start_at_ms=at_ms + 5_000)  # planned, none due yet
    sched, _ = await engine.schedules.create(NewSchedule(tenant="acme", spec=spec), now_ms=at_ms)
    await tick_all(engine, now)
    delivered = await worker.read(count=4, block_ms=10)
    assert [d.run_id for d in delivered] == near[:4], delivered
    stream = k.stream(shard, "acme", "default")
    bucket = k.bucket(shard, far_due - far_due % engine.settings.bucket_ms)

    # Repaired by --repair.
    await c.hdel(bucket, k.bucket_member(far[0]))  # a far member deleted
    faults.expect(Kind.NOT_IN_WHEEL, far[0])
    await c.zrem(k.near(shard, "acme"), late)  # a near member deleted: reads as sent
    faults.expect(Kind.DISPATCHED_WITHOUT_ENTRY, late)
    await c.xdel(stream, delivered[0].entry_id)  # a delivered entry deleted
    faults.expect(Kind.DISPATCHED_WITHOUT_ENTRY, near[0])
    await c.xack(stream, "timewheel", delivered[1].entry_id)  # XACK, not run_ack
    faults.expect(Kind.DELIVERED_NOT_PENDING, near[1])
    await c.zrem(k.plan(shard, "acme"), sched.id)  # a schedule out of its plan index
    faults.expect(Kind.SCHEDULE_UNINDEXED, sched.id)
    beta_shard = engine.store.shards_of("beta")[0]
    await c.zrem(k.due(beta_shard), "beta")  # a tenant out of the due index
    faults.expect(Kind.DUE_INDEX, beta[0])
    await c.srem(k.groups(shard), f"timewheel|{stream}")  # a group the reaper misses
    faults.expect(Kind.GROUP_UNWATCHED, stream)
    if repairable_only:
        return faults

    # Reported only.
    layout = await engine.store.body_layout(shard)
    await c.hdel(k.body(shard, far[1], layout), k.body_field(far[1], layout))  # a record deleted
    faults.expect(Kind.RECORD_MISSING, far[1])
    await c.hset(k.body(shard, far[2], layout), k.body_field(far[2], layout), b"\xc1 not a record")
    faults.expect(Kind.RECORD_CORRUPT, far[2])
    await c.xadd(stream, {"run_id": far[3], "attempt": "1"})  # an entry of a run not out
    faults.expect(Kind.STREAM_ENTRY_ORPHAN, far[3])
    await c.zadd(k.near(shard, "acme"), {far[4]: far_due + 4})  # in both levels
    faults.expect(Kind.WHEEL_DUPLICATE, far[4])
    assert await engine.outcomes.ack(delivered[2], "timewheel", now_ms=now)
    await c.zadd(k.near(shard, "acme"), {near[2]: at_ms + 102})  # a finished run in the wheel
    faults.expect(Kind.WHEEL_MEMBER_STALE, near[2])
    held = f"{sched.id}@{at_ms + 20_000}"  # held back by its schedule, with none in flight
    assert await c.zrem(k.near(shard, "acme"), held) or await c.hdel(
        k.bucket(shard, (at_ms + 20_000) - (at_ms + 20_000) % engine.settings.bucket_ms),
        k.bucket_member(held),
    )
    await c.hset(k.schedule(shard, sched.id), "held", held)
    faults.expect(Kind.HELD_STUCK, held)
    return faults
