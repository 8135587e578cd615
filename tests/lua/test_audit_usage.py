"""The audit's usage check (--events) against a real Redis, field by field: each q:<queue>
count, schedules and bytes of a tenant's usage hash against what its records and
schedules give; --repair sets a field back only while neither it nor the tenant moved."""

from __future__ import annotations

from typing import Any

from timewheel.audit import AuditOptions
from timewheel.audit.calls import AuditCalls
from timewheel.audit.findings import Finding, Kind
from timewheel.audit.repair import Repairer
from timewheel.engine import Engine
from timewheel.errors import PermanentError
from timewheel.runs.delivery import Delivery
from timewheel.runs.worker import Worker
from timewheel.schedules.model import NewSchedule
from timewheel.schedules.spec import ScheduleSpec
from timewheel.store.shard import Call
from timewheel.tasks.model import NewTask
from timewheel.testing.audit import audit
from timewheel.testing.clock import NOW
from timewheel.testing.dispatch import prime, tick_all, work_until
from timewheel.types import text

AT = NOW + 700


async def _tenant(engine: Engine) -> tuple[int, dict[str, str]]:
    """acme with runs in two queues, one dead-lettered run (its payload still counts in
    bytes), a schedule (in its queue, schedules and bytes) and one run of it asked for by
    hand; the shard of the first run, and that shard's usage hash as it is."""
    await prime(engine)
    mail = await engine.tasks.create(
        NewTask("acme", queue="mail", payload_json='"hello"', run_at_ms=NOW + 60_000)
    )
    shard = engine.store.locate(mail.task_id)
    await engine.tasks.create(
        NewTask("acme", queue="sms", payload_json='{"n": 12345}', run_at_ms=NOW + 60_000)
    )
    doomed = await engine.tasks.create(
        NewTask("acme", queue="jobs", payload_json='"die"', run_at_ms=NOW + 100)
    )
    spec = ScheduleSpec(every_s=3600, start_at_ms=NOW + 3_600_000)
    sched, _ = await engine.schedules.create(
        NewSchedule("acme", spec=spec, queue="mail", payload_json='"tick"'), now_ms=NOW
    )
    await engine.schedules.trigger("acme", sched.id, now_ms=NOW + 60_000)
    await tick_all(engine, NOW + 500)
    worker = Worker(engine.store, "acme", "jobs", consumer="w1")

    async def handle(d: Delivery) -> None:
        raise PermanentError("no")

    await work_until(worker, handle, lambda: worker.failed >= 1, 20)
    assert (await engine.tasks.get("acme", doomed.task_id)).state == "dead"
    return shard, await _hash(engine, shard)


async def _hash(engine: Engine, shard: int) -> dict[str, str]:
    raw: Any = await engine.client.hgetall(engine.keys.usage(shard, "acme"))
    return {text(k): text(v) for k, v in raw.items()}


def _usage(report: Any) -> list[tuple[int, str, str, str]]:
    return sorted(
        (f.shard, f.tenant, f.id, f.detail)
        for f in report.findings
        if f.kind is Kind.USAGE_MISMATCH
    )


async def test_every_field_of_a_clean_tenant_agrees(engine: Engine) -> None:
    _, held = await _tenant(engine)
    assert {"q:mail", "q:sms", "schedules", "bytes"} <= set(held), held
    assert int(held["bytes"]) > 0
    report = await audit(engine, AT, events=True)
    assert report.clean, report.findings


async def test_a_queue_count_and_the_bytes_are_found_then_repaired(engine: Engine) -> None:
    shard, held = await _tenant(engine)
    ukey = engine.keys.usage(shard, "acme")
    await engine.client.hincrby(ukey, "q:mail", 3)
    await engine.client.hincrby(ukey, "bytes", -4)
    mail, size = int(held["q:mail"]), int(held["bytes"])
    report = await audit(engine, AT, events=True)
    assert _usage(report) == [
        (shard, "acme", "bytes", f"use:acme bytes: the records give {size}, "
         f"the hash counts {size - 4}"),
        (shard, "acme", "q:mail", f"use:acme q:mail: the records give {mail}, "
         f"the hash counts {mail + 3}"),
    ]  # fmt: skip
    assert report.total == 2, report.findings

    repaired = await audit(engine, AT, events=True, repair=True)
    assert repaired.repairs == {Kind.USAGE_MISMATCH: {"repaired": 2}}
    assert await _hash(engine, shard) == held
    after = await audit(engine, AT, events=True)
    assert after.clean, after.findings


async def test_a_missing_queue_count_is_found_and_put_back(engine: Engine) -> None:
    shard, held = await _tenant(engine)
    await engine.client.hdel(engine.keys.usage(shard, "acme"), "q:sms")
    report = await audit(engine, AT, events=True, repair=True)
    [finding] = report.findings
    assert (finding.kind, finding.id) == (Kind.USAGE_MISMATCH, "q:sms")
    assert "the hash counts nothing" in finding.detail
    assert await _hash(engine, shard) == held
    assert (await audit(engine, AT, events=True)).clean


async def _found(engine: Engine) -> tuple[int, dict[str, str], dict[str, Finding]]:
    """acme's q:mail and bytes broken and audited, not repaired."""
    shard, held = await _tenant(engine)
    ukey = engine.keys.usage(shard, "acme")
    await engine.client.hincrby(ukey, "q:mail", 3)
    await engine.client.hincrby(ukey, "bytes", 7)
    report = await audit(engine, AT, events=True)
    found = {f.id: f for f in report.findings if f.kind is Kind.USAGE_MISMATCH}
    assert set(found) == {"q:mail", "bytes"}, report.findings
    return shard, held, found


def _repairer(engine: Engine) -> Repairer:
    return Repairer(AuditCalls(engine.store, AuditOptions(now_ms=AT, events=True)))


async def test_a_tenant_that_creates_after_the_audit_read_is_not_repaired(
    engine: Engine,
) -> None:
    shard, held, found = await _found(engine)
    # A create in another queue of the same shard: q:mail still holds what the audit
    # read, but the tenant's event since the read refuses the repair.
    for _ in range(50):
        created = await engine.tasks.create(NewTask("acme", queue="other", run_at_ms=NOW + 60_000))
        if engine.store.locate(created.task_id) == shard:
            break
    else:
        raise AssertionError("no create landed in the tenant's first shard")
    before = await _hash(engine, shard)
    repairer = _repairer(engine)
    assert await repairer.repair(found["q:mail"]) is False
    assert await repairer.repair(found["bytes"]) is False  # changed by the create, too
    assert repairer.outcomes == {(Kind.USAGE_MISMATCH, "unchanged"): 2}
    assert await _hash(engine, shard) == before
    assert before["q:mail"] == str(int(held["q:mail"]) + 3)


async def test_a_field_changed_after_the_audit_read_is_not_repaired(engine: Engine) -> None:
    shard, held, found = await _found(engine)
    await engine.client.hincrby(engine.keys.usage(shard, "acme"), "q:mail", 1)
    repairer = _repairer(engine)
    assert await repairer.repair(found["q:mail"]) is False
    assert await repairer.repair(found["bytes"]) is True  # untouched since: repaired
    now = await _hash(engine, shard)
    assert now["q:mail"] == str(int(held["q:mail"]) + 4)
    assert now["bytes"] == held["bytes"]


async def test_too_many_events_or_a_trimmed_log_is_busy(engine: Engine) -> None:
    shard, held, found = await _found(engine)
    c, k = engine.client, engine.keys
    read, since = found["q:mail"].data.split("|", 3)[2:]
    calls = AuditCalls(engine.store, AuditOptions(now_ms=AT, events=True))

    def repair(most: int, mark: str = since, finding: str = "q:mail") -> Call[tuple[int, str]]:
        field, expected, read, _ = found[finding].data.split("|", 3)
        call = calls.repair_usage(shard, "acme", field, expected, read, mark)
        return Call(call.script, call.keys, [*call.args[:-1], most], call.decode)

    events = k.events(shard)
    for i in range(3):  # events of another tenant
        await c.xadd(events, {"e": "updated", "id": f"x{i}", "tenant": "beta"})
    assert await engine.store.run(repair(2)) == (0, "busy")
    last: Any = await c.xrevrange(events, count=1)
    newest = text(last[0][0])
    await c.xtrim(events, minid=newest, approximate=False)  # the audit's mark trimmed
    assert await engine.store.run(repair(10)) == (0, "busy")
    assert await engine.store.run(repair(10, "0-0")) == (0, "busy")  # trimmed since
    assert (await _hash(engine, shard))["q:mail"] == read
    # Only another tenant's events since a mark the log still holds: repaired.
    assert await engine.store.run(repair(10, newest)) == (1, "")
    assert (await _hash(engine, shard))["q:mail"] == held["q:mail"]
    # A log empty at the audit's mark and never trimmed since: every entry is read.
    await c.delete(events)
    await c.xadd(events, {"e": "updated", "id": "y", "tenant": "beta"})
    assert await engine.store.run(repair(10, "0-0", "bytes")) == (1, "")
    assert (await _hash(engine, shard))["bytes"] == held["bytes"]


async def test_a_name_that_only_contains_the_tenant_does_not_refuse(engine: Engine) -> None:
    shard, held, found = await _found(engine)
    c, k = engine.client, engine.keys
    await c.xadd(k.events(shard), {"e": "acked", "runs": "abc:acme2:1,def:xacme:1"})
    assert await _repairer(engine).repair(found["q:mail"]) is True
    assert (await _hash(engine, shard))["q:mail"] == held["q:mail"]
    await c.hincrby(k.usage(shard, "acme"), "q:mail", 3)
    report = await audit(engine, AT, events=True)
    [finding] = [f for f in report.findings if f.id == "q:mail"]
    await c.xadd(k.events(shard), {"e": "acked", "runs": "abc:acme:1"})
    assert await _repairer(engine).repair(finding) is False
