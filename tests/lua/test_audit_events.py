"""The audit's event-log check (--events) against a real Redis: each run the newest log
entries name is in the state its last event left it in; a record gone while its run is
open, or one whose state its last event does not give, is a finding; runs finished and
cancelled in every way are not."""

from __future__ import annotations

from typing import Any

from timewheel.audit import AuditOptions, AuditPass
from timewheel.audit.archived import ArchiveCheck
from timewheel.audit.events import EventCheck
from timewheel.audit.findings import Kind
from timewheel.engine import Engine
from timewheel.ids import shard_of
from timewheel.runs.delivery import Delivery
from timewheel.runs.worker import Worker
from timewheel.tasks.model import NewTask
from timewheel.testing.archive import archive_all
from timewheel.testing.audit import audit, found
from timewheel.testing.clock import NOW
from timewheel.testing.dispatch import prime, tick_all, work_until


async def _history(engine: Engine) -> dict[str, str]:
    """Runs in every state the log can leave them: scheduled and cancelled (acme),
    succeeded (acme, acknowledged by a worker), dispatched (beta, never read)."""
    await prime(engine)
    ids = {}
    for name, tenant, due in (
        ("scheduled", "acme", NOW + 60_000),
        ("cancelled", "acme", NOW + 60_000),
        ("succeeded", "acme", NOW + 100),
        ("dispatched", "beta", NOW + 100),
    ):
        ids[name] = (await engine.tasks.create(NewTask(tenant, run_at_ms=due))).task_id
    await engine.tasks.cancel("acme", ids["cancelled"], now_ms=NOW)
    await tick_all(engine, NOW + 500)
    worker = Worker(engine.store, "acme", "default", consumer="w1")
    acked: set[str] = set()

    async def handle(d: Delivery) -> None:
        acked.add(d.run_id)

    await work_until(worker, handle, lambda: ids["succeeded"] in acked, 20)
    assert (await engine.tasks.get("acme", ids["succeeded"])).state == "succeeded"
    assert (await engine.tasks.get("beta", ids["dispatched"])).state == "dispatched"
    return ids


async def test_runs_in_every_state_agree_with_their_last_event(engine: Engine) -> None:
    await _history(engine)
    report = await audit(engine, NOW + 700, events=True)
    assert report.clean, report.findings
    assert report.examined.events >= 4


async def test_a_lost_record_and_a_state_its_event_does_not_give_are_found(
    engine: Engine,
) -> None:
    ids = await _history(engine)
    c = engine.client
    lost = ids["scheduled"]
    raw: Any = await c.hget(*(await engine.store.record_key(lost)))
    assert await c.hdel(*(await engine.store.record_key(lost))) == 1
    # the cancelled run's record replaced by the lost one's, which says scheduled
    cancelled = ids["cancelled"]
    await c.hset(*(await engine.store.record_key(cancelled)), raw)
    without = await audit(engine, NOW + 700)
    report = await audit(engine, NOW + 700, events=True)
    added = found(report) - found(without)
    assert added == {
        (Kind.RUN_LOST.value, lost),
        (Kind.EVENT_STATE_MISMATCH.value, cancelled),
    }
    assert {f.tenant for f in report.findings if f.kind is Kind.RUN_LOST} == {"acme"}


async def test_an_open_run_of_the_archive_without_its_record_is_found(
    engine: Engine, postgres_dsn: str
) -> None:
    ids = await _history(engine)
    await archive_all(engine, postgres_dsn)
    check = ArchiveCheck(engine.store, postgres_dsn)
    assert await check.check() == []
    assert check.checked >= 2  # the scheduled and the dispatched runs are open
    c = engine.client
    lost = ids["scheduled"]
    shard = engine.store.locate(lost)
    assert await c.hdel(*(await engine.store.record_key(lost))) == 1
    report = await AuditPass(
        engine.store,
        AuditOptions(now_ms=NOW + 700),
        archive=ArchiveCheck(engine.store, postgres_dsn),
    ).run()
    archived = [f for f in report.findings if f.kind is Kind.ARCHIVE_RUN_LOST]
    assert [(f.id, f.tenant, f.shard) for f in archived] == [(lost, "acme", shard)]
    assert report.examined.archived >= 2
    # bounded: one open run per check, going on where the last stopped
    step = ArchiveCheck(engine.store, postgres_dsn)
    seen = [await step.check(limit=1) for _ in range(check.checked)]
    assert sum(len(s) for s in seen) == 1


async def test_a_usage_count_its_records_do_not_give_is_found(engine: Engine) -> None:
    ids = await _history(engine)
    # acme holds one scheduled run in its shard (the succeeded and cancelled ones are
    # finished); beta one dispatched run
    assert (await audit(engine, NOW + 700, events=True)).clean
    shard = engine.store.locate(ids["scheduled"])
    await engine.client.hincrby(engine.keys.usage(shard, "acme"), "q:default", 2)
    report = await audit(engine, NOW + 700, events=True)
    assert [(f.kind, f.tenant, f.shard, f.id) for f in report.findings] == [
        (Kind.USAGE_MISMATCH, "acme", shard, "q:default")
    ]
    assert "the records give 1, the hash counts 3" in report.findings[0].detail
    assert (await audit(engine, NOW + 700)).clean  # without --events: not checked


async def test_a_log_trimmed_past_the_window_during_a_pass_is_not_judged(
    engine: Engine,
) -> None:
    """A record deleted while its run is open is run_lost; but if the log loses the
    window's first entry before the pass ends, an event the pass relied on may be gone,
    so the pass judges nothing rather than report what it cannot know."""
    made = await engine.tasks.create(NewTask("acme", run_at_ms=NOW + 60_000))
    shard, keys = shard_of(made.task_id), engine.keys
    assert shard is not None
    await engine.client.hdel(*(await engine.store.record_key(made.task_id)))

    async def run(trim: bool) -> list[Kind]:
        check = EventCheck(engine.store, shard, batch=100)
        while check.phase in ("start", "window"):
            await check.step()  # the window is read
        if trim:  # a newer entry, and the window's first one trimmed away
            await engine.tasks.create(NewTask("acme", run_at_ms=NOW + 60_000))
            await engine.client.xtrim(keys.events(shard), maxlen=1, approximate=False)
        kinds: list[Kind] = []
        while not check.done:
            kinds.extend(f.kind for f in (await check.step())[1])
        return kinds

    assert await run(trim=False) == [Kind.RUN_LOST]
    assert await run(trim=True) == []
