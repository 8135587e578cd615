"""The archiver against the event logs (timewheel/audit/archived.py, archiver_behind): a
shard whose first event not archived is older than the threshold is a finding, with the
entries it is behind; once the archiver has caught up, or with nothing left to archive,
there is none."""

from __future__ import annotations

from timewheel.audit import AuditPass
from timewheel.audit.archived import ArchiveCheck, archiver_views, behind_findings
from timewheel.audit.findings import Kind
from timewheel.engine import Engine
from timewheel.tasks.model import NewTask
from timewheel.testing.archive import archive_all


async def _server_ms(engine: Engine) -> int:
    views = await archiver_views(engine.store)
    return views[0].now_ms


async def test_events_left_unarchived_past_the_threshold_are_archiver_behind(
    engine: Engine, postgres_dsn: str
) -> None:
    await engine.tasks.create_many([NewTask(f"t{i}", delay_ms=3_600_000) for i in range(8)])
    await archive_all(engine, postgres_dsn)
    caught_up = await archiver_views(engine.store)
    assert all(v.mark and v.behind == 0 and v.oldest == "" for v in caught_up if v.length)
    # the archiver stops; a tenant goes on creating
    made = [await engine.tasks.create(NewTask("late", delay_ms=3_600_000)) for _ in range(5)]
    [shard] = {engine.store.locate(m.task_id) for m in made}
    now = await _server_ms(engine)
    # judged by the shard's clock: a minute on, the entries are older than 60 s
    later = await archiver_views(engine.store, now_ms=now + 61_000)
    [finding] = behind_findings(later, 60_000)
    assert finding.kind is Kind.ARCHIVER_BEHIND and finding.shard == shard
    assert finding.detail.startswith("the archiver has not archived 5 event-log entries")
    assert later[shard].oldest == finding.id
    assert behind_findings(later, 62_000) == []  # younger than that threshold
    # a pass with --archive: a threshold of 0 makes every entry not archived late
    check = ArchiveCheck(engine.store, postgres_dsn, behind_ms=0)
    report = await AuditPass(engine.store, archive=check).run()
    assert [(f.kind, f.shard) for f in report.findings] == [(Kind.ARCHIVER_BEHIND, shard)]
    assert report.counts == {Kind.ARCHIVER_BEHIND: 1}
    # the archiver runs again and catches up: the finding is gone
    await archive_all(engine, postgres_dsn)
    report = await AuditPass(engine.store, archive=check).run()
    assert report.clean, report.findings


async def test_a_shard_no_archiver_ever_marked_is_behind_from_its_first_entry(
    engine: Engine, postgres_dsn: str
) -> None:
    made = await engine.tasks.create(NewTask("fresh", delay_ms=3_600_000))
    shard = engine.store.locate(made.task_id)
    views = await archiver_views(engine.store)
    view = views[shard]
    assert view.mark == "" and view.length == 1 and view.oldest
    assert all(v.oldest == "" for v in views if v.shard != shard)
    [late] = behind_findings(await archiver_views(engine.store, now_ms=view.now_ms + 5000), 1000)
    assert late.shard == shard and late.id == view.oldest
    assert "no archiver has marked the shard: 1 event-log entry not archived" in late.detail
    await archive_all(engine, postgres_dsn)
    assert behind_findings(await archiver_views(engine.store), 0) == []
