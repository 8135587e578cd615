"""The redis-cli scripts of deploy/redis-cli, run as an operator runs them against a real
Redis holding a deployment made through the engine: tasks near and far, dispatched and
pending in a consumer group, dead letters, a schedule's runs, a cancelled task, a lease
and a heartbeat. Each test checks the values the script prints; a standalone server
and a 3-primary Cluster, where keys live on several nodes."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import redis

from timewheel.dispatch.leases import Leases
from timewheel.engine import Engine
from timewheel.runs import dead_letters
from timewheel.runs.worker import Worker
from timewheel.schedules.model import NewSchedule
from timewheel.schedules.spec import ScheduleSpec
from timewheel.store.server import RedisServer
from timewheel.tasks.model import NewTask
from timewheel.testing.dispatch import prime, tick_all
from timewheel.testing.redis_cluster import RedisClusterServers
from timewheel.testing.settings import test_settings

SCRIPTS = Path(__file__).resolve().parents[2] / "deploy" / "redis-cli"


def _iso(ms: int) -> str:
    at = datetime.fromtimestamp(ms // 1000, UTC)
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def _run(
    url: str, prefix: str, script: str, *args: str, status: int = 0, scripts: Path = SCRIPTS
) -> subprocess.CompletedProcess[str]:
    where = urlparse(url)
    done = subprocess.run(
        [str(scripts / script), "-h", str(where.hostname), "-p", str(where.port), "--", *args],
        env={**os.environ, "TIMEWHEEL_PREFIX": prefix},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == status, f"{script} {args}: {done.returncode}\n{done.stderr}"
    return done


def _out(engine: Engine, script: str, *args: str) -> str:
    done = _run(engine.settings.redis_url, engine.settings.prefix, script, *args)
    assert done.stderr == ""
    return done.stdout


def _table(text: str) -> list[dict[str, str]]:
    """The rows of a table whose first line is its header (up to the first blank line)."""
    lines = text.split("\n\n", 1)[0].splitlines()
    header = lines[0].split()
    return [
        dict(zip(header, line.split(maxsplit=len(header) - 1), strict=True)) for line in lines[1:]
    ]


def _fields(text: str) -> dict[str, list[str]]:
    """'name value' lines: name -> its values, in order."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        out.setdefault(name, []).append(value.strip())
    return out


@dataclass
class World:
    """A deployment made through the engine, and what each script should find in it."""

    now: int
    acme: int  # shard of tenant acme: dispatched, pending, dead, and near-level runs
    globex: int  # shard of tenant globex: two far runs
    initech: int  # shard of tenant initech: a schedule's runs and a cancelled task
    dead: str  # failed permanently
    pending: str  # read by consumer c1, not acknowledged
    undelivered: str  # dispatched, not yet read
    near: list[str]  # scheduled, due, in the near level
    far: list[str]  # scheduled, in far buckets
    far_due: list[int]
    schedule: str
    schedule_runs: dict[str, int]
    cancelled: str
    epoch: int


async def _populate(engine: Engine) -> World:
    shard_of = {t: engine.store.shards_of(t)[0] for t in ("acme", "globex", "initech")}
    assert len(set(shard_of.values())) == 3
    sec, usec = await engine.client.time()
    now = sec * 1000 + usec // 1000
    await prime(engine, now)

    sent = [
        (await engine.tasks.create(NewTask(tenant="acme", run_at_ms=now - 5000 + i))).task_id
        for i in range(3)
    ]
    assert (await engine.dispatch.tick(shard_of["acme"], now_ms=now)).dispatched == 3
    near = [
        (
            await engine.tasks.create(
                NewTask(tenant="acme", run_at_ms=now - 1000 + i, payload_json=f'{{"n":{i}}}')
            )
        ).task_id
        for i in range(2)
    ]
    worker = Worker(engine.store, "acme", "default", consumer="c1")
    got = await worker.read(count=2, block_ms=100)
    assert [d.run_id for d in got] == sent[:2]
    assert await worker.fail(got[0], "ValueError: bad input", permanent=True) == "dead"

    far_due = [now + 600_000, now + 620_000]
    far = [
        (await engine.tasks.create(NewTask(tenant="globex", run_at_ms=due))).task_id
        for due in far_due
    ]
    start = now + 3_600_000
    schedule, _ = await engine.schedules.create(
        NewSchedule(tenant="initech", spec=ScheduleSpec(every_s=10, start_at_ms=start))
    )
    # The planner, on a clock 10 s before the first fire time, materializes the first runs.
    await engine.planner.plan(shard_of["initech"], now_ms=start - 10_000, clock_ms=start - 10_000)
    runs: Any = await engine.client.zrange(
        engine.keys.schedule_runs(shard_of["initech"], schedule.id), 0, -1, withscores=True
    )
    assert runs
    cancelled = (
        await engine.tasks.create(NewTask(tenant="initech", run_at_ms=now + 7_200_000))
    ).task_id
    await engine.tasks.cancel("initech", cancelled)

    leases = Leases(engine.store, "node-x", 60_000)
    assert await leases.members() == ["node-x"]
    epoch = await leases.acquire(shard_of["acme"])
    assert epoch is not None
    return World(
        now=now,
        acme=shard_of["acme"],
        globex=shard_of["globex"],
        initech=shard_of["initech"],
        dead=sent[0],
        pending=sent[1],
        undelivered=sent[2],
        near=near,
        far=far,
        far_due=far_due,
        schedule=schedule.id,
        schedule_runs={rid.decode(): int(ms) for rid, ms in runs},
        cancelled=cancelled,
        epoch=epoch,
    )


@pytest.fixture
async def world(standalone_engine: Engine) -> World:
    return await _populate(standalone_engine)


def _changes(url: str) -> int:
    """Writes to the server since its start (INFO persistence)."""
    client = redis.Redis.from_url(url)
    try:
        info = client.info("persistence")
    finally:
        client.close()
    return int(info["rdb_changes_since_last_save"])


async def test_due_per_shard_counts_what_waits_in_each_shard(
    standalone_engine: Engine, world: World
) -> None:
    rows = {r["shard"]: r for r in _table(_out(standalone_engine, "due-per-shard"))}
    assert list(rows) == [*map(str, range(8)), "total"]
    sched = len(world.schedule_runs)
    expected = {
        world.acme: ("2", "2", "0", "2", "2", _iso(world.now - 1000), "node-x"),
        world.globex: ("2", "0", "2", "0", "0", _iso(world.far_due[0]), "-"),
        world.initech: (
            str(sched),
            "0",
            str(sched),
            "0",
            "0",
            _iso(min(world.schedule_runs.values())),
            "-",
        ),
    }
    for shard in range(8):
        row = rows[str(shard)]
        got = tuple(row[c] for c in ("pending", "near", "far", "due", "unacked", "next_due"))
        want = expected.get(shard, ("0", "0", "0", "0", "0", "-", "-"))
        assert (*got, row["owner"]) == want, shard
    total = rows["total"]
    assert (total["pending"], total["near"], total["far"], total["due"]) == (
        str(4 + sched),
        "2",
        str(2 + sched),
        "2",
    )
    assert (total["unacked"], total["next_due"]) == ("2", _iso(world.now - 1000))


async def test_hottest_shards_ranks_shards_by_the_column_asked_for(
    standalone_engine: Engine, world: World
) -> None:
    by_pending = _table(_out(standalone_engine, "hottest-shards", "3"))
    sched = len(world.schedule_runs)
    assert [(r["shard"], r["pending"]) for r in by_pending] == sorted(
        [(str(world.initech), str(sched)), (str(world.acme), "2"), (str(world.globex), "2")],
        key=lambda r: (-int(r[1]), int(r[0])),
    )
    by_due = _table(_out(standalone_engine, "hottest-shards", "1", "due"))
    assert [(r["shard"], r["due"], r["owner"]) for r in by_due] == [
        (str(world.acme), "2", "node-x")
    ]
    by_far = _table(_out(standalone_engine, "hottest-shards", "2", "far"))
    assert [r["shard"] for r in by_far] == [str(world.initech), str(world.globex)]


async def test_shard_wheel_shows_marks_lease_near_level_per_tenant_and_far_buckets(
    standalone_engine: Engine, world: World
) -> None:
    acme = _out(standalone_engine, "shard-wheel", str(world.acme))
    lines = acme.splitlines()
    assert lines[0] == f"shard {world.acme} ({{{standalone_engine.settings.prefix}:{world.acme}}}:)"
    fields = _fields(acme)
    assert fields["hwm"] == [f"{_iso(world.now)} ({world.now} ms)"]
    assert fields["epoch"] == [str(world.epoch)]
    assert fields["lease"][0].startswith(f"node-x at epoch {world.epoch}, ")
    assert "near level: tenants 1, runs 2, due 2" in lines
    near = _table(acme.split("near level: tenants 1, runs 2, due 2\n", 1)[1])
    assert near == [
        {
            "tenant": "acme",
            "runs": "2",
            "due": "2",
            "earliest": _iso(world.now - 1000),
            "due_index": _iso(world.now - 1000),
            "rate": "-",
            "tokens": "-",
        }
    ]
    assert "far level: buckets 0, runs 0" in lines
    assert "distant level: buckets 0, runs 0" in lines

    globex = _out(standalone_engine, "shard-wheel", str(world.globex), "1")
    assert "near level: tenants 0, runs 0, due 0" in globex.splitlines()
    assert fields["promoted_until"] == _fields(globex)["promoted_until"]
    assert "far level: buckets 2, runs 2" in globex.splitlines()
    listed = globex.split("far level: buckets 2, runs 2\n", 1)[1].splitlines()
    start = world.far_due[0] - world.far_due[0] % standalone_engine.settings.bucket_ms
    assert _table("\n".join(listed[:-1])) == [  # BUCKETS 1: the oldest only
        {
            "bucket": str(start),
            "start": _iso(start),
            "runs": "1",
            "earliest": _iso(world.far_due[0]),
        }
    ]
    assert listed[-1] == "(1 more buckets)"


async def test_tenant_backlog_shows_depth_groups_lag_and_the_pending_entries(
    standalone_engine: Engine, world: World
) -> None:
    out = _out(standalone_engine, "tenant-backlog", "acme")
    assert _table(out) == [
        {
            "shard": str(world.acme),
            "queue": "default",
            "length": "2",  # the dead one's entry is gone; one pending, one not yet read
            "group": "timewheel",
            "consumers": "1",
            "pending": "1",
            "lag": "1",
        }
    ]
    pending = _table(out.split("pending entries, longest idle first:\n", 1)[1])
    assert len(pending) == 1
    entry = pending[0]
    assert (entry["consumer"], entry["deliveries"], entry["run_id"]) == ("c1", "1", world.pending)
    assert 0 <= int(entry["idle_ms"]) < 60_000
    no_entries = _out(standalone_engine, "tenant-backlog", "acme", "default", "0")
    assert _table(no_entries) == _table(out)
    assert "pending entries" not in no_entries
    assert _out(standalone_engine, "tenant-backlog", "acme", "emails") == (
        "no ready streams of tenant acme queue emails\n"
    )
    assert _out(standalone_engine, "tenant-backlog", "globex") == (
        "no ready streams of tenant globex\n"
    )


async def test_tenant_dead_letters_lists_the_newest_with_reason_and_error(
    standalone_engine: Engine, world: World
) -> None:
    out = _out(standalone_engine, "tenant-dead-letters", "acme")
    assert _table(out) == [
        {"shard": str(world.acme), "dead_letters": "1"},
        {"shard": "total", "dead_letters": "1"},
    ]
    (letter,), _ = await dead_letters.list_dead(standalone_engine.store, "acme")
    entries = _table(out.split("newest first:\n", 1)[1])
    assert entries == [
        {
            "dead_at": _iso(letter.dead_ms),
            "shard": str(world.acme),
            "entry": letter.entry_id.split("-", 1)[1],  # the API's id is <shard>-<entry>
            "run_id": world.dead,
            "queue": "default",
            "attempt": "1",
            "reason": "failed",
            "error": "ValueError: bad input",
        }
    ]
    assert "newest first" not in _out(standalone_engine, "tenant-dead-letters", "acme", "0")
    assert _out(standalone_engine, "tenant-dead-letters", "globex") == (
        "no dead letters of tenant globex\n"
    )


async def test_shard_leases_shows_owners_epochs_heartbeats_and_unowned_shards(
    standalone_engine: Engine, world: World
) -> None:
    out = _out(standalone_engine, "shard-leases")
    leases = {r["shard"]: r for r in _table(out)}
    assert len(leases) == 8
    mine = leases[str(world.acme)]
    assert (mine["owner"], mine["epoch"], mine["meta_epoch"]) == ("node-x", "1", "1")
    assert world.epoch == 1
    assert 50_000 < int(mine["ttl_ms"]) <= 60_000
    free = [r for s, r in leases.items() if s != str(world.acme)]
    assert all(r["owner"] == r["epoch"] == r["ttl_ms"] == r["meta_epoch"] == "-" for r in free)
    nodes = _table(out.split("\n\n")[1])
    assert [(n["node"], n["shards"]) for n in nodes] == [("node-x", "1")]
    assert 0 <= int(nodes[0]["age_ms"]) < 60_000
    assert out.splitlines()[-1] == "unowned shards: 7 of 8"


async def test_task_record_decodes_each_kind_of_run_and_says_where_it_sits(
    standalone_engine: Engine, world: World
) -> None:
    tag = f"{{{standalone_engine.settings.prefix}:"

    def record(run_id: str) -> dict[str, list[str]]:
        return _fields(_out(standalone_engine, "task-record", run_id))

    near = record(world.near[1])
    assert (near["state"], near["attempt"], near["tenant"], near["queue"]) == (
        ["scheduled"],
        ["0"],
        ["acme"],
        ["default"],
    )
    assert near["due"][0].startswith(f"{_iso(world.now - 999)} {world.now - 999} (-")
    assert near["payload"] == ['{"n":1}']
    assert near["where"] == [f"near level {tag}{world.acme}}}:near:acme score {world.now - 999}"]
    assert "stored" not in near

    sent = record(world.pending)
    assert (sent["state"], sent["attempt"]) == (["dispatched"], ["1"])
    assert sent["stored"] == ["scheduled attempt 0 (the tick sent it without rewriting the record)"]
    stream = f"{tag}{world.acme}}}:q:acme:default"
    assert sent["where"][0].startswith(f"ready stream {stream} entry ")
    assert sent["where"][1].startswith("pending in group timewheel consumer c1 idle_ms ")
    assert sent["where"][1].endswith(" deliveries 1")

    waiting = record(world.undelivered)
    assert waiting["state"] == ["dispatched"]
    assert waiting["where"][1:] == ["not yet delivered to group timewheel"]

    dead = record(world.dead)
    (letter,), _ = await dead_letters.list_dead(standalone_engine.store, "acme")
    assert (dead["state"], dead["attempt"], dead["last_error"]) == (
        ["dead"],
        ["1"],
        ["ValueError: bad input"],
    )
    entry = letter.entry_id.split("-", 1)[1]
    assert dead["dead_entry"] == [entry]
    assert dead["where"] == [f"dead letters {tag}{world.acme}}}:dead:acme entry {entry}"]

    far = record(world.far[0])
    start = world.far_due[0] - world.far_due[0] % standalone_engine.settings.bucket_ms
    assert far["state"] == ["scheduled"]
    assert far["where"] == [f"far bucket {tag}{world.globex}}}:w:{start} from {_iso(start)}"]

    run_id, due = min(world.schedule_runs.items(), key=lambda item: item[1])
    run = record(run_id)
    assert (run["state"], run["tenant"], run["schedule"]) == (
        ["scheduled"],
        ["initech"],
        [world.schedule],
    )
    assert run["due"][0].startswith(f"{_iso(due)} {due} (+")
    assert run["where"][0].startswith(f"far bucket {tag}{world.initech}}}:w:")

    cancelled = record(world.cancelled)
    assert cancelled["state"] == ["cancelled"]
    updated = int(cancelled["updated"][0].split()[1])
    finished = updated - updated % standalone_engine.settings.bucket_ms
    assert cancelled["where"] == [
        f"finished, kept for retention in {tag}{world.initech}}}:xl:{finished}"
    ]

    missing = world.near[0][:3] + "0" * 13
    assert record(missing)["record"][0].startswith("none ")


async def test_the_scripts_write_nothing(own_redis: RedisServer) -> None:
    """On a server of its own (where no other test's keys expire meanwhile), the count of
    writes Redis keeps does not move while every script runs."""
    engine = await Engine.connect(test_settings(own_redis.url))
    try:
        world = await _populate(engine)
        before = _changes(own_redis.url)
        for script, *args in [
            ["due-per-shard"],
            ["hottest-shards"],
            ["shard-wheel", str(world.acme)],
            ["tenant-backlog", "acme"],
            ["tenant-dead-letters", "acme"],
            ["shard-leases"],
            ["task-record", world.pending],
            ["task-record", world.dead],
            ["task-record", world.cancelled],
        ]:
            assert _out(engine, script, *args)
        assert _changes(own_redis.url) == before
    finally:
        await engine.close()


def test_a_snippet_that_writes_is_refused_by_redis(
    tmp_path: Path, redis_standalone: RedisServer
) -> None:
    """Every snippet goes through lib/common.bash under 'flags=no-writes': a write in one
    fails in Redis, and the script with it."""
    copy = tmp_path / "redis-cli"
    shutil.copytree(SCRIPTS, copy)
    (copy / "lua" / "poke.lua").write_text("redis.call('SET', KEYS[1], 'x')\nreturn {'ok'}\n")
    script = copy / "poke"
    script.write_text(
        '#!/usr/bin/env bash\nTW_USAGE=""\nsource "$(dirname "$0")/lib/common.bash"\n'
        'tw_parse "$@"\ntw_eval poke "{tw:0}:poked"\n'
    )
    script.chmod(0o755)
    done = _run(redis_standalone.url, "tw", "poke", status=1, scripts=copy)
    assert "Write commands are not allowed from read-only scripts" in done.stderr
    client = redis.Redis.from_url(redis_standalone.url)
    try:
        assert client.exists("{tw:0}:poked") == 0
    finally:
        client.close()


async def test_the_scripts_refuse_bad_arguments_and_report_what_redis_answers(
    standalone_engine: Engine, world: World, redis_standalone: RedisServer
) -> None:
    url, prefix = standalone_engine.settings.redis_url, standalone_engine.settings.prefix
    usage = _run(url, prefix, "shard-wheel", status=2)
    assert usage.stderr.startswith("usage: shard-wheel [redis-cli options] [--] SHARD [BUCKETS]")
    assert (
        "shard 8: the deployment has shards 0-7"
        in _run(url, prefix, "shard-wheel", "8", status=1).stderr
    )
    assert "is not a task or run id" in _run(url, prefix, "task-record", "nope", status=1).stderr
    assert (
        "TENANT must be 1-64 characters"
        in _run(url, prefix, "tenant-backlog", "a*", status=1).stderr
    )
    assert "hottest-shards" in _run(url, prefix, "hottest-shards", "3", "size", status=2).stderr
    absent = _run(url, "nosuchprefix", "due-per-shard", status=1)
    assert "nosuchprefix:layout does not exist" in absent.stderr
    assert absent.stdout == ""
    refused = _env_run([str(SCRIPTS / "shard-wheel"), "3"], prefix, "false")
    assert refused.returncode == 1 and "redis-cli failed" in refused.stderr


def _env_run(args: list[str], prefix: str, cli: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args,
        env={**os.environ, "TIMEWHEEL_PREFIX": prefix, "REDIS_CLI": cli},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_without_options_the_arguments_are_the_scripts(
    standalone_engine: Engine, world: World, tmp_path: Path
) -> None:
    """No `--`: every argument is the script's (or none at all); REDIS_CLI names the
    redis-cli to run, here one that knows the server."""
    where = urlparse(standalone_engine.settings.redis_url)
    cli = tmp_path / "redis-cli"
    cli.write_text(f'#!/bin/sh\nexec redis-cli -h {where.hostname} -p {where.port} "$@"\n')
    cli.chmod(0o755)
    prefix = standalone_engine.settings.prefix
    for args in (["due-per-shard"], ["shard-wheel", str(world.acme)], ["task-record", world.dead]):
        done = _env_run([str(SCRIPTS / args[0]), *args[1:]], prefix, str(cli))
        assert done.returncode == 0, done.stderr
        assert _stable(done.stdout) == _stable(_out(standalone_engine, *args))


def _stable(text: str) -> list[str]:
    """Output less what moves from one run to the next (the clock, the lease's time left)."""
    return [
        re.sub(r" \([+-][0-9.]+s\)", "", line)
        for line in text.splitlines()
        if not line.startswith(("now ", "lease "))
    ]


# --- Cluster ------------------------------------------------------------------------------------


def _nodes_of(url: str, keys: list[str]) -> list[str]:
    """The Cluster primary ('host:port') serving each key."""
    client: Any = redis.RedisCluster.from_url(url)
    try:
        return [str(client.get_node_from_key(key).name) for key in keys]
    finally:
        client.close()


def _spread_prefix(url: str, base: str) -> str:
    """A key prefix starting with `base` whose 8 shard tags fall on every primary."""
    for i in range(1000):
        prefix = f"{base}s{i}"
        if len(set(_nodes_of(url, [f"{{{prefix}:{s}}}:meta" for s in range(8)]))) == 3:
            return prefix
    raise AssertionError("no prefix spreads 8 shards over every primary")


@pytest.fixture
async def spread_cluster_engine(redis_cluster: RedisClusterServers) -> AsyncIterator[Engine]:
    """An engine on the Cluster whose shards live on every primary and whose tenants
    spread over all 8 shards."""
    url = redis_cluster.url
    prefix = _spread_prefix(url, test_settings(url).prefix)
    engine = await Engine.connect(test_settings(url, default_spread=8, prefix=prefix))
    try:
        yield engine
    finally:
        await engine.close()


@pytest.mark.cluster
async def test_on_a_cluster_the_scripts_read_every_shard_from_any_node(
    spread_cluster_engine: Engine, redis_cluster: RedisClusterServers
) -> None:
    engine = spread_cluster_engine
    sec, _ = await engine.client.time()
    now = sec * 1000
    await prime(engine, now)
    # Idempotency keys fix each task's shard: every shard gets some.
    created = [
        (
            await engine.tasks.create(
                NewTask(tenant="acme", run_at_ms=now - 1000, idempotency_key=f"k{i}")
            )
        ).task_id
        for i in range(40)
    ]
    per_shard = {s: sum(1 for t in created if int(t[:3], 16) == s) for s in range(8)}
    assert all(per_shard.values()), per_shard
    url = redis_cluster.url
    node_of = _nodes_of(url, [engine.keys.meta(s) for s in range(8)])
    assert len(set(node_of)) == 3  # the shards live on all three primaries

    # Any node answers for every shard: redis-cli follows the redirections.
    for server in redis_cluster.servers:
        rows = {
            r["shard"]: r
            for r in _table(_run(server.url, engine.settings.prefix, "due-per-shard").stdout)
        }
        assert {s: int(rows[str(s)]["near"]) for s in range(8)} == per_shard
        assert rows["total"]["due"] == "40"

    assert await tick_all(engine, now) == 40
    worker = Worker(engine.store, "acme", "default", consumer="c1")
    got: list[str] = []
    while len(got) < 40:
        deliveries = await worker.read(count=100, block_ms=100)
        assert deliveries
        for d in deliveries:
            got.append(d.run_id)
            if d.run_id in created[:10]:
                assert await worker.fail(d, "boom", permanent=True) == "dead"

    first = redis_cluster.servers[0].url
    backlog = _table(
        _run(first, engine.settings.prefix, "tenant-backlog", "acme", "default", "0").stdout
    )
    dead_per_shard = {s: sum(1 for t in created[:10] if int(t[:3], 16) == s) for s in range(8)}
    assert {int(r["shard"]): (int(r["length"]), int(r["pending"])) for r in backlog} == {
        s: (n - dead_per_shard[s], n - dead_per_shard[s]) for s, n in per_shard.items() if n
    }
    assert all(r["consumers"] == "1" and r["lag"] == "0" for r in backlog)

    dead = _run(first, engine.settings.prefix, "tenant-dead-letters", "acme", "100").stdout
    counts = _table(dead)
    assert {r["shard"]: r["dead_letters"] for r in counts} == {
        **{str(s): str(n) for s, n in dead_per_shard.items() if n},
        "total": "10",
    }
    listed = _table(dead.split("newest first:\n", 1)[1])
    assert sorted(r["run_id"] for r in listed) == sorted(created[:10])

    # A run on another primary than the one asked.
    asked = urlparse(first)
    far_off = next(t for t in created[10:] if node_of[int(t[:3], 16)] != asked.netloc)
    fields = _fields(_run(first, engine.settings.prefix, "task-record", far_off).stdout)
    assert (fields["state"], fields["attempt"]) == (["dispatched"], ["1"])
    assert fields["where"][1].startswith("pending in group timewheel consumer c1 ")


async def test_scripts_read_a_far_bucket_split_into_children(standalone_engine: Engine) -> None:
    """Past 1,000 runs of one shard in one bucket, new ones go to children
    'w:<start>:<hex>' (lua/lib/wheel.lua): the scripts count, list and find them."""
    engine = standalone_engine
    sec, usec = await engine.client.time()
    now = sec * 1000 + usec // 1000
    await prime(engine, now)
    due = now + 3_600_000
    ids: list[str] = []
    for _ in range(3):
        made = await engine.tasks.create_many(
            [NewTask(tenant="acme", run_at_ms=due) for _ in range(500)]
        )
        ids.extend(m.task_id for m in made)
    shard = engine.store.shards_of("acme")[0]
    start = due - due % engine.settings.bucket_ms

    rows = {r["shard"]: r for r in _table(_out(engine, "due-per-shard"))}
    assert rows[str(shard)]["far"] == "1500"

    wheel = _out(engine, "shard-wheel", str(shard), "100")
    buckets = wheel.split("far level: ", 1)[1]
    assert buckets.splitlines()[0].endswith("runs 1500")
    listed = _table("\n".join(buckets.splitlines()[1:]))
    assert listed[0]["bucket"] == str(start) and listed[0]["runs"] == "1000"
    assert {row["start"] for row in listed} == {_iso(start)}
    assert sum(int(row["runs"]) for row in listed) == 1500 and len(listed) == 17

    k = engine.keys
    in_child = [
        run_id
        for run_id in ids
        if not await engine.client.hexists(k.bucket(shard, start), k.bucket_member(run_id))
    ]
    assert len(in_child) == 500
    where = _fields(_out(engine, "task-record", in_child[0]))["where"]
    child = k.bucket_path(shard, start, k.bucket_member(in_child[0]))[1]
    assert where == [f"far bucket {child} from {_iso(start)}"]
