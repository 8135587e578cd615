"""Per-tenant counts, archive against Redis (timewheel/audit/counts.py): the runs created in
the window by archived state add up, the open runs of a tenant as the archive and as
Redis count them agree once every event is archived, a run Redis dropped is a
count_mismatch, and a tenant with events not archived yet is not judged."""

from __future__ import annotations

from timewheel.audit import AuditOptions, AuditPass
from timewheel.audit.counts import CountCheck, TenantCounts
from timewheel.audit.findings import Kind
from timewheel.engine import Engine
from timewheel.tasks.model import NewTask
from timewheel.testing.archive import archive_all
from timewheel.testing.clock import NOW
from timewheel.testing.dispatch import all_deliveries, prime, tick_all
from timewheel.testing.schedules import create, every, run_at

GROUP = "g"


async def _history(engine: Engine) -> dict[str, str]:
    """acme: two scheduled, one cancelled, one succeeded, one dead, a schedule with a
    planned run and a run triggered by hand; beta: one dispatched."""
    await prime(engine, NOW)
    ids: dict[str, str] = {}
    for name, tenant, due in (
        ("scheduled", "acme", NOW + 3_600_000),
        ("scheduled2", "acme", NOW + 3_600_000),
        ("cancelled", "acme", NOW + 3_600_000),
        ("succeeded", "acme", NOW + 100),
        ("dead", "acme", NOW + 100),
        ("dispatched", "beta", NOW + 100),
    ):
        made = await engine.tasks.create(NewTask(tenant, run_at_ms=due), now_ms=NOW)
        ids[name] = made.task_id
    await engine.tasks.cancel("acme", ids["cancelled"], now_ms=NOW)
    sid = await create(engine, every(3600), queue="cron", payload_json='"tick"')
    await engine.schedules.trigger("acme", sid, now_ms=NOW)
    sent = {d.run_id: d for d in await run_at(engine, NOW + 1000)}
    await engine.outcomes.ack(sent[ids["succeeded"]], GROUP, now_ms=NOW + 1100)
    await engine.outcomes.fail(sent[ids["dead"]], GROUP, "boom", permanent=True, now_ms=NOW + 1100)
    return ids


def _row(rows: list[TenantCounts], tenant: str) -> TenantCounts:
    [row] = [r for r in rows if r.tenant == tenant]
    return row


async def test_counts_add_up_and_agree_once_archived(engine: Engine, postgres_dsn: str) -> None:
    await _history(engine)
    await archive_all(engine, postgres_dsn)
    check = CountCheck(engine.store, postgres_dsn, window_ms=10**12)
    assert await check.check(now_ms=NOW + 2000) == []
    acme, beta = _row(check.tenants, "acme"), _row(check.tenants, "beta")
    # one-shot tasks, the triggered run and the schedule's planned runs all were created
    assert acme.states["scheduled"] >= 2
    assert acme.states["cancelled"] == 1
    assert acme.states["succeeded"] == 1
    assert acme.states["dead"] == 1
    assert acme.created == sum(acme.states.values())
    # counted runs not finished: the two scheduled tasks and the triggered run (in flight);
    # the planner's runs count through their schedule
    assert acme.settled and acme.open_archive == acme.open_redis == 3
    assert beta.settled and beta.open_archive == beta.open_redis == 1
    assert beta.states == {"dispatched": 1}


async def test_a_dropped_run_is_a_count_mismatch(engine: Engine, postgres_dsn: str) -> None:
    ids = await _history(engine)
    await archive_all(engine, postgres_dsn)
    # Redis loses a scheduled run of acme: its record, its wheel entry and its count
    lost = ids["scheduled"]
    k, c = engine.keys, engine.client
    shard = engine.store.locate(lost)
    assert await c.hdel(*(await engine.store.record_key(lost))) == 1
    await c.hincrby(k.usage(shard, "acme"), "q:default", -1)
    report = await AuditPass(
        engine.store,
        AuditOptions(now_ms=NOW + 2000),
        counts=CountCheck(engine.store, postgres_dsn, window_ms=10**12),
    ).run()
    mismatched = [f for f in report.findings if f.kind is Kind.COUNT_MISMATCH]
    assert [(f.tenant, f.shard) for f in mismatched] == [("acme", shard)]
    assert "archive holds 3" in mismatched[0].detail
    assert "Redis counts 2" in mismatched[0].detail
    acme = _row(report.tenants, "acme")
    assert (acme.open_archive, acme.open_redis) == (3, 2)
    assert _row(report.tenants, "beta").balanced


async def test_a_tenant_with_events_not_archived_is_not_judged(
    engine: Engine, postgres_dsn: str
) -> None:
    await _history(engine)
    await archive_all(engine, postgres_dsn)
    # acme creates more after the archiver's last round: Redis counts them, the archive
    # does not hold them yet
    await engine.tasks.create_many([NewTask("acme", run_at_ms=NOW + 3_600_000) for _ in range(4)])
    check = CountCheck(engine.store, postgres_dsn, window_ms=10**12)
    assert await check.check(now_ms=NOW + 2000) == []
    acme = _row(check.tenants, "acme")
    assert not acme.settled
    assert (acme.open_archive, acme.open_redis) == (3, 7)
    assert _row(check.tenants, "beta").settled
    await archive_all(engine, postgres_dsn)
    assert await check.check(now_ms=NOW + 2000) == []
    acme = _row(check.tenants, "acme")
    assert acme.settled and acme.open_archive == acme.open_redis == 7


async def test_the_window_counts_only_runs_created_in_it(engine: Engine, postgres_dsn: str) -> None:
    await _history(engine)
    await archive_all(engine, postgres_dsn)
    check = CountCheck(engine.store, postgres_dsn, window_ms=1000)
    # every run was created at NOW, more than the window before NOW + 5000
    assert await check.check(now_ms=NOW + 5000) == []
    assert all(r.created == 0 for r in check.tenants)
    assert _row(check.tenants, "acme").open_archive == 3  # open runs are not windowed
    unused = await all_deliveries(engine)
    assert unused  # beta's dispatched run is still in its stream
    assert await tick_all(engine, NOW + 5000) == 0


async def test_a_pass_in_small_steps_finds_the_count_mismatch_one_check_finds(
    engine: Engine, postgres_dsn: str
) -> None:
    ids = await _history(engine)
    await archive_all(engine, postgres_dsn)
    lost = ids["scheduled"]
    k, c = engine.keys, engine.client
    shard = engine.store.locate(lost)
    assert await c.hdel(*(await engine.store.record_key(lost))) == 1
    await c.hincrby(k.usage(shard, "acme"), "q:default", -1)
    # as the continuous auditor runs it: no window counts, a few things per step
    check = CountCheck(engine.store, postgres_dsn, window_ms=None)
    audit = AuditPass(engine.store, AuditOptions(now_ms=NOW + 2000), counts=check)
    steps = 1
    while not await audit.step(3):
        steps += 1
    assert steps > engine.settings.shards  # the event logs alone take a step per shard
    report = audit.report()
    counted = [(f.kind, f.tenant) for f in report.findings if f.kind is Kind.COUNT_MISMATCH]
    assert counted == [(Kind.COUNT_MISMATCH, "acme")]
    assert set(report.counts) == {Kind.COUNT_MISMATCH, Kind.RECORD_MISSING}  # its wheel member
    acme = _row(report.tenants, "acme")
    assert (acme.open_archive, acme.open_redis) == (3, 2) and acme.states == {}
    assert _row(report.tenants, "beta").balanced


async def test_a_count_that_moves_between_its_read_and_the_event_logs_is_not_judged(
    engine: Engine, postgres_dsn: str
) -> None:
    await _history(engine)
    await archive_all(engine, postgres_dsn)
    check = CountCheck(engine.store, postgres_dsn, window_ms=None)
    check.begin()
    while check.phase != "events":
        assert (await check.step(1))[1] == []
    # acme's usage was read; it creates before the event logs are read
    await engine.tasks.create(NewTask("acme", run_at_ms=NOW + 3_600_000))
    findings: list[object] = []
    while not check.done:
        findings += (await check.step(1))[1]
    assert findings == []
    acme = _row(check.tenants, "acme")
    assert not acme.settled and (acme.open_archive, acme.open_redis) == (3, 3)
    # the next check, with the create archived, sees both sides at 4
    await archive_all(engine, postgres_dsn)
    assert await check.check() == []
    acme = _row(check.tenants, "acme")
    assert acme.settled and acme.open_archive == acme.open_redis == 4
