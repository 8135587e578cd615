"""The restore script on a real Redis: the record is written whole and placed in the
wheel; a run already there is left alone."""

from __future__ import annotations

from typing import Any

import pytest
from redis.exceptions import ResponseError

from timewheel import ids
from timewheel.archive.replay import RestoredRun
from timewheel.engine import Engine


async def test_restore_script_writes_the_record_and_places_it_in_the_wheel(
    standalone_engine: Engine,
) -> None:
    engine = standalone_engine
    run_id = ids.make_task_id(3, ids.new_token())
    run = RestoredRun(
        state="dispatched",
        attempt=2,
        due_ms=5_000_000,
        tenant="a",
        queue="q",
        created_ms=1_000,
        payload='{"x":1}',
        opts='{"retry":{"max_attempts":3}}',
        updated_ms=2_000,
        last_error="boom",
    )
    keys, bucket_ms = [engine.keys.meta(3)], engine.settings.bucket_ms
    reply = await engine.store.scripts.restore_runs(
        engine.client, keys, [bucket_ms, 1, *run.args(run_id)]
    )
    assert reply == [1, 0]
    task = await engine.tasks.get("a", run_id)
    assert (task.state, task.attempt, task.due_ms, task.queue, task.created_ms) == (
        "scheduled",
        2,
        5_000_000,
        "q",
        1_000,
    )
    assert (task.updated_ms, task.payload_json, task.last_error, task.schedule_id) == (
        2_000,
        '{"x":1}',
        "boom",
        None,
    )
    assert task.options == {"retry": {"max_attempts": 3}}
    member = engine.keys.bucket_member(run_id)  # in the wheel: its distant bucket, the
    distant = engine.keys.far_path(3, 5_000_000, bucket_ms, member)[4]  # shard never promoted
    assert distant == engine.keys.tag(3) + "wd:3600000"
    assert await engine.client.hexists(distant, member)
    # A run already there is left alone; malformed input is an error reply.
    again = await engine.store.scripts.restore_runs(
        engine.client, keys, [bucket_ms, 1, *run.args(run_id)]
    )
    assert again == [0, 1]
    with pytest.raises(ResponseError, match="n <= 200 groups of 11"):
        await engine.store.scripts.restore_runs(
            engine.client, keys, [bucket_ms, 2, *run.args(run_id)]
        )


async def test_restore_finished_writes_dead_letters_and_retained_records(
    standalone_engine: Engine,
) -> None:
    """A dead run gets its record, a dead letter with its reason and error, and its
    payload counted; a succeeded one its record, indexed for expiry when it finished."""
    engine = standalone_engine
    dead_id, done_id = (ids.make_task_id(5, ids.new_token()) for _ in range(2))
    common = {"tenant": "a", "queue": "q", "created_ms": 1_000, "payload": '{"x":1}'}
    dead = RestoredRun(
        state="dead", attempt=3, due_ms=2_000, updated_ms=9_000, last_error="boom",
        reason="lease_expired", **common,  # type: ignore[arg-type]
    )  # fmt: skip
    done = RestoredRun(state="succeeded", attempt=1, due_ms=2_000, updated_ms=7_000, **common)  # type: ignore[arg-type]
    keys, bucket_ms = [engine.keys.meta(5)], engine.settings.bucket_ms
    args = [*dead.finished_args(dead_id), *done.finished_args(done_id)]
    reply = await engine.store.scripts.restore_finished(engine.client, keys, [bucket_ms, 2, *args])
    assert reply == [2, 0]
    task = await engine.tasks.get("a", dead_id)
    assert (task.state, task.attempt, task.last_error, task.updated_ms) == (
        "dead",
        3,
        "boom",
        9_000,
    )
    letters: Any = await engine.client.xrange(engine.keys.dead(5, "a"))
    [(_, letter)] = letters
    assert (letter[b"run_id"], letter[b"reason"], letter[b"error"], letter[b"dead_ms"]) == (
        dead_id.encode(),
        b"lease_expired",
        b"boom",
        b"9000",
    )
    assert await engine.client.hget(engine.keys.usage(5, "a"), "bytes") == b"7"
    assert (await engine.tasks.get("a", done_id)).state == "succeeded"
    bucket = 7_000 - 7_000 % bucket_ms
    assert await engine.client.zscore(engine.keys.expiry(5), bucket) == bucket
    assert await engine.client.lpos(engine.keys.retained(5, bucket), done_id) is not None
    again = await engine.store.scripts.restore_finished(engine.client, keys, [bucket_ms, 2, *args])
    assert again == [0, 2]
    letters = await engine.client.xrange(engine.keys.dead(5, "a"))
    assert len(letters) == 1
