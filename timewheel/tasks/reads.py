"""Reading one-shot tasks: a task's record, and whether a run its record says is
scheduled was in fact sent.

The tick does not rewrite a record it sends (lua/dispatch_tick.lua): a sent run is one
that left the wheel, which is read here the way lua/lib/record.lua's record_sent reads
it (its near level, its far bucket, its pair's park set, its schedule's held run)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.exceptions import RedisError

from timewheel.errors import RedisUnavailable, TaskNotFound
from timewheel.store import bodies, record
from timewheel.store.bodies import BodyLayout
from timewheel.store.keys import WHEEL_LEVELS, Keys
from timewheel.store.shard import Store
from timewheel.tasks.model import Task


async def get(store: Store, tenant: str, task_id: str) -> Task:
    """The task as stored. Another tenant's id is TaskNotFound, like an unknown one."""
    shard = store.locate(task_id)
    k = store.keys
    sid = task_id.split("@", 1)[0] if "@" in task_id else None
    layout = store.body_layouts.get(shard) or BodyLayout()
    while True:
        key, field = layout.place(k.tag(shard), task_id)
        try:
            # What record_sent (lua/lib/record.lua) reads, in the same round trip: the
            # keys share the shard's hash tag, so one node on Cluster too. The body
            # layout is read after the record: the one the key was guessed by if no
            # hash split in between (store/bodies.py).
            pipe = store.client.pipeline(transaction=False)
            pipe.hget(key, field)
            pipe.hmget(k.meta(shard), "promoted_until", *bodies.META_FIELDS)
            pipe.zscore(k.near(shard, tenant), task_id)
            pipe.hget(k.schedule(shard, sid or "-"), "held")
            raw, meta, score, held = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"get failed: {exc}") from exc
        promoted, actual = meta[0], BodyLayout.read(meta[1:])
        if actual == layout:
            break
        layout = store.body_layouts[shard] = actual
    if not isinstance(raw, bytes):
        raise TaskNotFound(task_id)
    task = record.decode(task_id, raw)
    if task.tenant != tenant:
        raise TaskNotFound(task_id)
    if task.state == "scheduled":
        # Only a run out of its near level needs a second round trip: its far bucket
        # (due past promoted_until: a future run) or its pair's park set (a run due
        # but parked while its ready stream is over its backlog cap).
        if score is None and task.due_ms < int(promoted or 0):
            score = await _parked_score(store, shard, task)
        far = score is None and task.due_ms >= int(promoted or 0)
        in_far = far and await _in_far(store, shard, [task])
        if record.is_sent(task_id, task.due_ms, promoted, score, held, in_far):
            task = record.decode(task_id, raw, sent=True)
    return task


def _far_lookups(pipe: Any, store: Store, shard: int, task: Task) -> None:
    """HEXISTS of the run in each far and distant bucket of its path (store/keys.py
    far_path), FAR_LOOKUPS replies."""
    member = Keys.bucket_member(task.run_id)
    for key in store.keys.far_path(shard, task.due_ms, store.settings.bucket_ms, member):
        pipe.hexists(key, member)


FAR_LOOKUPS = 2 * WHEEL_LEVELS


async def _parked_score(store: Store, shard: int, task: Task) -> Any:
    """The run's score in its pair's park set (lua/lib/park.lua), or None."""
    try:
        return await store.client.zscore(
            store.keys.park(shard, task.tenant, task.queue), task.run_id
        )
    except (RedisError, OSError) as exc:
        raise RedisUnavailable(f"cannot read the park set: {exc}") from exc


async def _in_far(store: Store, shard: int, tasks: Sequence[Task]) -> bool:
    """Whether every one of `tasks` is in a far bucket of its path (one round trip)."""
    try:
        pipe = store.client.pipeline(transaction=False)
        for t in tasks:
            _far_lookups(pipe, store, shard, t)
        found: list[Any] = await pipe.execute()
    except (RedisError, OSError) as exc:
        raise RedisUnavailable(f"cannot read the far level: {exc}") from exc
    return all(any(found[i : i + FAR_LOOKUPS]) for i in range(0, len(found), FAR_LOOKUPS))


async def sent_runs(store: Store, shard: int, tasks: Sequence[Task]) -> set[str]:
    """The run ids of `tasks` (records read from `shard`) that say scheduled but were
    sent (lua/lib/record.lua, record_sent): one round trip."""
    waiting = [t for t in tasks if t.state == "scheduled"]
    if not waiting:
        return set()
    k = store.keys
    try:
        pipe = store.client.pipeline(transaction=False)
        pipe.hget(k.meta(shard), "promoted_until")
        for t in waiting:
            pipe.zscore(k.near(shard, t.tenant), t.run_id)
            # '-' names no schedule: a one-shot run is never held.
            pipe.hget(k.schedule(shard, t.schedule_id or "-"), "held")
            pipe.zscore(k.park(shard, t.tenant, t.queue), t.run_id)  # parked: waiting
            _far_lookups(pipe, store, shard, t)
        replies: list[Any] = await pipe.execute()
    except (RedisError, OSError) as exc:
        raise RedisUnavailable(f"cannot read the wheel: {exc}") from exc
    promoted = replies[0]
    out = set()
    step = 3 + FAR_LOOKUPS
    for i, t in enumerate(waiting):
        near, held, parked, *far = replies[1 + step * i : 1 + step * (i + 1)]
        if record.is_sent(t.run_id, t.due_ms, promoted, near or parked, held, any(far)):
            out.add(t.run_id)
    return out
