"""The archive's read-only scripts on a real Redis: lua/snapshot_sent.lua names, of runs
whose records say scheduled, the ones the tick sent (in neither level of the wheel), and
no other; lua/archive_records.lua returns records as stored, in order."""

from __future__ import annotations

import time

import pytest
from redis.exceptions import ResponseError

from timewheel import ids
from timewheel.engine import Engine
from timewheel.store import record
from timewheel.tasks.model import NewTask


async def _sent(engine: Engine, run_ids: list[str]) -> list[str]:
    """The run ids snapshot_sent names sent, asked shard by shard."""
    out: list[str] = []
    for shard in sorted({engine.store.locate(r) for r in run_ids}):
        mine = [r for r in run_ids if engine.store.locate(r) == shard]
        reply = await engine.store.scripts.snapshot_sent(
            engine.client, [engine.keys.meta(shard)], mine
        )
        out.extend(mine[int(i) - 1] for i in reply)
    return sorted(out)


async def test_snapshot_sent_names_the_runs_the_tick_sent(standalone_engine: Engine) -> None:
    engine = standalone_engine
    now = int(time.time() * 1000)

    async def create(run_at_ms: int) -> str:
        made = await engine.tasks.create(NewTask(tenant="a", payload_json="1", run_at_ms=run_at_ms))
        return made.task.run_id

    far = await create(now + 3_600_000)
    out = [await create(now - 1000) for _ in range(3)]
    cancelled = await create(now + 3_600_000)
    await engine.tasks.cancel("a", cancelled)
    for shard in range(engine.settings.shards):
        await engine.dispatch.promote(shard)
        await engine.dispatch.tick(shard)
    near = await create(now - 1000)
    for shard in range(engine.settings.shards):
        await engine.dispatch.promote(shard)  # in the near level, not yet sent
    gone = ids.make_task_id(engine.store.locate(far), ids.new_token())
    for run_id in (*out, far, near):
        assert (await engine.tasks.get("a", run_id)).state in ("scheduled", "dispatched")
    # Their records say scheduled (the tick does not rewrite them): the script tells.
    assert await _sent(engine, [far, *out, cancelled, near, gone]) == sorted(out)
    with pytest.raises(ResponseError, match="at most 500"):
        await _sent(engine, [far] * 501)


async def test_archive_records_returns_each_record_as_stored(standalone_engine: Engine) -> None:
    engine = standalone_engine
    made = await engine.tasks.create(NewTask(tenant="a", payload_json='{"p":1}', delay_ms=60_000))
    run_id = made.task.run_id
    shard = engine.store.locate(run_id)
    gone = ids.make_task_id(shard, ids.new_token())
    script, meta = engine.store.scripts.archive_records, [engine.keys.meta(shard)]
    raw = await engine.client.hget(*(await engine.store.record_key(run_id)))
    assert isinstance(raw, bytes)
    assert await script(engine.client, meta, [gone, run_id, gone]) == [None, raw, None]
    assert record.decode_fields(raw)[6] == '{"p":1}'
    with pytest.raises(ResponseError, match="at most 1000"):
        await script(engine.client, meta, [run_id] * 1001)
