"""`timewheel snapshot` and `timewheel restore` processes: Redis wiped (FLUSHALL) after a
snapshot and more work comes back from PostgreSQL; the CLI refuses what it must with one
line and the right exit code."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence

import pytest

from timewheel.config import Settings
from timewheel.engine import Engine
from timewheel.errors import TaskNotFound
from timewheel.models import Task
from timewheel.store.server import RedisServer
from timewheel.tasks.model import NewTask
from timewheel.testing.archive import archive_all
from timewheel.testing.clock import FakeClock
from timewheel.testing.dispatch import all_deliveries, running_scheduler
from timewheel.testing.settings import test_settings

CLI = [sys.executable, "-m", "timewheel.cli"]
HOUR_MS = 3_600_000


def cli_env(settings: Settings) -> dict[str, str]:
    return {
        **os.environ,
        "TIMEWHEEL_PREFIX": settings.prefix,
        "TIMEWHEEL_SHARDS": str(settings.shards),
        "TIMEWHEEL_BUCKET_MS": str(settings.bucket_ms),
    }


def run_cli(args: Sequence[str], settings: Settings) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        env=cli_env(settings),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


async def wait_dispatched(engine: Engine, tenant: str, task_ids: Sequence[str]) -> None:
    deadline = time.monotonic() + 20
    while True:
        states = [(await engine.tasks.get(tenant, t)).state for t in task_ids]
        if all(s == "dispatched" for s in states):
            return
        assert time.monotonic() < deadline, states
        await asyncio.sleep(0.05)


async def pending(engine: Engine, tasks: dict[str, str]) -> dict[str, Task]:
    """The tasks (id -> tenant) that are still scheduled."""
    out: dict[str, Task] = {}
    for task_id, tenant in tasks.items():
        task = await engine.tasks.get(tenant, task_id)
        if task.state == "scheduled":
            out[task_id] = task
    return out


async def test_restore_brings_back_pending_tasks_after_flushall(
    own_redis: RedisServer, postgres_dsn: str
) -> None:
    settings = test_settings(own_redis.url, postgres_dsn=postgres_dsn)
    dsn_args = ["--postgres-dsn", postgres_dsn, "--redis-url", own_redis.url]
    engine = await Engine.connect(settings)
    tasks: dict[str, str] = {}
    try:
        # Before the snapshot: far tasks, a few updated, a few dispatched (not acked).
        first = [
            NewTask(tenant=f"t{i % 3}", payload_json=f'{{"n":{i}}}', delay_ms=HOUR_MS + i)
            for i in range(150)
        ]
        made = await engine.tasks.create_many(first)
        tasks.update((r.task_id, n.tenant) for r, n in zip(made, first, strict=True))
        for r, n in list(zip(made, first, strict=True))[:10]:
            await engine.tasks.update(n.tenant, r.task_id, payload_json='"changed before"')
        early = await engine.tasks.create_many([NewTask(tenant="t0", delay_ms=0) for _ in range(5)])
        async with running_scheduler(engine):
            await wait_dispatched(engine, "t0", [r.task_id for r in early])
        await archive_all(engine, postgres_dsn)
        snap = run_cli(["snapshot", *dsn_args], settings)
        assert snap.returncode == 0, snap.stderr
        assert "snapshot 1: 155 tasks" in snap.stdout

        # After it: more creates, cancels of old and new, updates, more dispatches.
        second = [
            NewTask(tenant=f"t{i % 3}", payload_json=f'{{"m":{i}}}', delay_ms=3 * HOUR_MS + i)
            for i in range(80)
        ]
        made2 = await engine.tasks.create_many(second)
        tasks.update((r.task_id, n.tenant) for r, n in zip(made2, second, strict=True))
        for task_id in list(tasks)[100:130] + [r.task_id for r in made2[:10]]:
            await engine.tasks.cancel(tasks[task_id], task_id)
        for task_id in list(tasks)[140:150] + [r.task_id for r in made2[70:]]:
            await engine.tasks.update(
                tasks[task_id], task_id, payload_json='"changed after"', delay_ms=2 * HOUR_MS
            )
        late = await engine.tasks.create_many([NewTask(tenant="t1", delay_ms=0) for _ in range(5)])
        async with running_scheduler(engine):
            await wait_dispatched(engine, "t1", [r.task_id for r in late])
        await archive_all(engine, postgres_dsn)
        # The archiver caught up: everything below was created before its last event.
        expected = await pending(engine, tasks)
        assert len(expected) == 150 + 80 - 40
        unacked = [r.task_id for r in early + late]
        cancelled = list(tasks)[100:130]

        await engine.client.flushall()
        refused = run_cli(["restore", *dsn_args], settings)
        assert refused.returncode == 0, refused.stderr  # empty after FLUSHALL: not refused
        assert "restored 200 runs from snapshot 1" in refused.stdout, refused.stdout
    finally:
        await engine.close()

    engine = await Engine.connect(settings)
    try:
        for task_id, want in expected.items():
            got = await engine.tasks.get(want.tenant, task_id)
            assert (got.state, got.payload_json, got.due_ms, got.queue, got.created_ms) == (
                "scheduled",
                want.payload_json,
                want.due_ms,
                want.queue,
                want.created_ms,
            ), task_id
        for task_id in cancelled:  # cancelled after the snapshot: back as cancelled
            assert (await engine.tasks.get(tasks[task_id], task_id)).state == "cancelled"
        # Dispatched and not acknowledged at the wipe: back, due, same run id, next attempt.
        for task_id in unacked:
            got = await engine.tasks.get(
                "t0" if task_id in {r.task_id for r in early} else "t1", task_id
            )
            assert (got.state, got.attempt) == ("scheduled", 1)
        # A scheduler dispatches them all: the overdue ones now, the rest once due (a
        # fake clock two days ahead stands for waiting).
        async with running_scheduler(engine):
            deadline = time.monotonic() + 20
            while len(await all_deliveries(engine)) < len(unacked):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
        clock = FakeClock.from_wall_clock()
        clock.advance(48 * HOUR_MS)
        for shard in range(settings.shards):
            while (await engine.dispatch.promote(shard, now_ms=clock.now_ms)).more:
                pass
            while (await engine.dispatch.tick(shard, now_ms=clock.now_ms, limit=5000)).dispatched:
                pass
        delivered = {d.run_id: d for d in await all_deliveries(engine)}
        assert set(delivered) == set(expected) | set(unacked)
        for task_id, want in expected.items():
            assert delivered[task_id].payload == json.loads(want.payload_json)
            assert delivered[task_id].attempt == 1
        assert all(delivered[t].attempt == 2 for t in unacked)
    finally:
        await engine.close()


async def test_restore_refuses_a_non_empty_redis_unless_forced(
    own_redis: RedisServer, postgres_dsn: str
) -> None:
    settings = test_settings(own_redis.url)
    dsn_args = ["--postgres-dsn", postgres_dsn, "--redis-url", own_redis.url]
    engine = await Engine.connect(settings)
    try:
        [made] = await engine.tasks.create_many([NewTask(tenant="a", delay_ms=HOUR_MS)])
        await archive_all(engine, postgres_dsn)
        assert run_cli(["snapshot", *dsn_args], settings).returncode == 0
        refused = run_cli(["restore", *dsn_args], settings)
        assert refused.returncode == 2
        assert refused.stderr.startswith("timewheel: Redis at ") and "not empty" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
        forced = run_cli(["restore", "--force", *dsn_args], settings)
        assert forced.returncode == 0, forced.stderr
        assert "restored 0 runs" in forced.stdout and "1 already present" in forced.stdout
        assert (await engine.tasks.get("a", made.task_id)).state == "scheduled"
    finally:
        await engine.close()


@pytest.mark.parametrize(
    ("dsn", "code", "message"),
    [
        ("postgresql://nobody@127.0.0.1:1/none", 1, "cannot connect to PostgreSQL"),
        ("this is not a dsn", 2, "DSN is malformed"),
        ("", 2, "no PostgreSQL DSN"),
    ],
)
@pytest.mark.parametrize("command", ["restore", "snapshot", "archiver"])
def test_bad_dsn_is_one_line_and_an_exit_code(
    standalone_url: str, command: str, dsn: str, code: int, message: str
) -> None:
    settings = test_settings(standalone_url)
    done = run_cli([command, "--postgres-dsn", dsn, "--redis-url", standalone_url], settings)
    assert done.returncode == code, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_restore_without_a_snapshot_says_so(own_redis: RedisServer, postgres_dsn: str) -> None:
    settings = test_settings(own_redis.url)
    done = run_cli(
        ["restore", "--postgres-dsn", postgres_dsn, "--redis-url", own_redis.url], settings
    )
    assert done.returncode == 2
    assert "no timewheel tables" in done.stderr and "Traceback" not in done.stderr


async def test_schedules_come_back_and_resume_per_their_catchup_policy(
    own_redis: RedisServer, postgres_dsn: str
) -> None:
    from timewheel.schedules.model import NewSchedule, ScheduleChanges
    from timewheel.schedules.spec import ScheduleSpec

    settings = test_settings(own_redis.url, postgres_dsn=postgres_dsn, misfire_ms=1_000)
    dsn_args = ["--postgres-dsn", postgres_dsn, "--redis-url", own_redis.url]
    engine = await Engine.connect(settings)
    try:
        every = ScheduleSpec(every_s=1)
        skip, _ = await engine.schedules.create(NewSchedule("a", every, catchup="skip"))
        latest, _ = await engine.schedules.create(NewSchedule("a", every, catchup="latest"))
        hourly, _ = await engine.schedules.create(NewSchedule("b", ScheduleSpec(cron="0 * * * *")))
        async with running_scheduler(engine):
            await asyncio.sleep(1.5)
        await archive_all(engine, postgres_dsn)
        assert run_cli(["snapshot", *dsn_args], settings).returncode == 0
        # After the snapshot: one schedule made, one changed, one deleted (archived only).
        after, _ = await engine.schedules.create(NewSchedule("b", ScheduleSpec(every_s=60)))
        await engine.schedules.update("b", hourly.id, ScheduleChanges(payload_json='"v2"'))
        gone, _ = await engine.schedules.create(NewSchedule("a", ScheduleSpec(every_s=60)))
        await engine.schedules.delete("a", gone.id)
        await archive_all(engine, postgres_dsn)
        await engine.client.flushall()
        wiped_ms = int(time.time() * 1000)
        await asyncio.sleep(3.0)  # fire times go by while Redis is empty
        done = run_cli(["restore", *dsn_args], settings)
        assert done.returncode == 0, done.stderr
    finally:
        await engine.close()

    engine = await Engine.connect(settings)
    try:
        assert (await engine.schedules.get("b", hourly.id)).payload_json == '"v2"'
        assert (await engine.schedules.get("b", after.id)).state == "active"
        with pytest.raises(TaskNotFound):
            await engine.schedules.get("a", gone.id)
        restarted_ms = int(time.time() * 1000)
        async with running_scheduler(engine):
            await asyncio.sleep(2.5)
        deliveries = await all_deliveries(engine)
        sent: dict[str, list[int]] = {}
        for d in deliveries:
            sent.setdefault(d.schedule_id or "", []).append(d.due_ms)

        def caught_up(sid: str) -> list[int]:
            """Fire times missed while Redis was gone and sent anyway: past misfire_ms."""
            return [
                d.due_ms
                for d in deliveries
                if d.schedule_id == sid
                and d.due_ms > wiped_ms
                and d.dispatched_ms - d.due_ms > settings.misfire_ms
            ]

        # skip: no fire time missed while Redis was gone runs; latest: exactly one does,
        # the newest missed when the planner came back (which one depends on when that
        # was, shortly after restarted_ms: a slow host moves it, not the count).
        assert caught_up(skip.id) == []
        assert len(caught_up(latest.id)) == 1
        # Both go on firing after the restore.
        assert max(sent[skip.id]) > restarted_ms and max(sent[latest.id]) > restarted_ms
    finally:
        await engine.close()


async def test_dry_run_writes_nothing_and_restore_reports_progress_and_one_summary(
    own_redis: RedisServer, postgres_dsn: str
) -> None:
    settings = test_settings(own_redis.url, postgres_dsn=postgres_dsn, shards=2)
    dsn_args = ["--postgres-dsn", postgres_dsn, "--redis-url", own_redis.url]
    engine = await Engine.connect(settings)
    try:
        made = await engine.tasks.create_many(
            [NewTask(tenant=f"t{i % 3}", delay_ms=HOUR_MS) for i in range(12)]
        )
        await engine.tasks.cancel("t0", made[0].task_id)
        await archive_all(engine, postgres_dsn)
        assert run_cli(["snapshot", *dsn_args], settings).returncode == 0
        await engine.client.flushall()

        dry = run_cli(["restore", "--dry-run", *dsn_args], settings)
        assert dry.returncode == 0, dry.stderr
        lines = dry.stdout.strip().splitlines()
        assert [line.split(":")[0] for line in lines[:-1]] == ["shard 0", "shard 1"]
        pending = sum(int(line.split(": ")[1].split()[0]) for line in lines[:-1])
        assert pending == 11
        assert lines[-1].startswith("would restore 11 runs from snapshot 1 (1 finished, ")
        assert await engine.client.dbsize() == 0  # nothing written, not even the layout

        done = run_cli(["restore", *dsn_args], settings)
        assert done.returncode == 0, done.stderr
        [summary] = done.stdout.strip().splitlines()
        assert summary.startswith("restored 11 runs from snapshot 1 (1 finished, 0 dead")
        assert summary.endswith(" s") and " in " in summary
        assert "restore_progress" in done.stderr and "steps=4" in done.stderr
        assert (await engine.tasks.get("t0", made[0].task_id)).state == "cancelled"
    finally:
        await engine.close()


def test_restore_draws_a_progress_bar_on_a_terminal(
    own_redis: RedisServer, postgres_dsn: str
) -> None:
    """stderr a terminal: a bar (rich) instead of log lines; stdout keeps its one line."""
    import pty

    settings = test_settings(own_redis.url, postgres_dsn=postgres_dsn, shards=2)
    dsn_args = ["--postgres-dsn", postgres_dsn, "--redis-url", own_redis.url]
    assert run_cli(["snapshot", *dsn_args], settings).returncode == 0, "snapshot"
    main, secondary = pty.openpty()
    try:
        done = subprocess.run(
            [*CLI, "restore", "--force", *dsn_args],  # the snapshot wrote the layout
            env={**cli_env(settings), "COLUMNS": "100"},
            stdout=subprocess.PIPE,
            stderr=secondary,
            stdin=subprocess.DEVNULL,
            text=True,
            timeout=120,
        )
        os.close(secondary)
        secondary = -1
        drawn = b""
        for _ in range(1000):  # bounded: read what the pty holds until it is closed
            try:
                chunk = os.read(main, 65536)
            except OSError:
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        if secondary >= 0:
            os.close(secondary)
        os.close(main)
    assert done.returncode == 0, drawn
    assert done.stdout.startswith("restored 0 runs from snapshot 1")
    assert b"restore" in drawn and b"restore_progress" not in drawn
