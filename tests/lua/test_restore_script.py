"""The restore script on a real Redis: the record is written whole and placed in the
wheel; a run already there is left alone."""

from __future__ import annotations

import pytest
from redis.exceptions import ResponseError

from timewheel import ids
from timewheel.archive.restore import RestoredRun
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
    bucket = engine.keys.bucket(3, 5_000_000 - 5_000_000 % bucket_ms)
    assert await engine.client.hexists(bucket, engine.keys.bucket_member(run_id))  # far level
    # A run already there is left alone; malformed input is an error reply.
    again = await engine.store.scripts.restore_runs(
        engine.client, keys, [bucket_ms, 1, *run.args(run_id)]
    )
    assert again == [0, 1]
    with pytest.raises(ResponseError, match="n <= 200 groups of 11"):
        await engine.store.scripts.restore_runs(
            engine.client, keys, [bucket_ms, 2, *run.args(run_id)]
        )
