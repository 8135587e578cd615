"""A lane packs a call's repeating head once (timewheel/store/pipeline.py Lane.pack): the
bytes must be those of the whole command packed at once, whatever the head."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from hypothesis import given
from hypothesis import strategies as st

from timewheel.store import pipeline
from timewheel.store.library import Library, Script, ScriptArg
from timewheel.store.pipeline import Lane, pack_call
from timewheel.store.shard import Call

LIBRARY = Library("timewheel_test", "test", "")
SCRIPTS = [Script("task_create", f"{LIBRARY.name}_task_create", LIBRARY), Script("x", "x", LIBRARY)]

arg = st.one_of(
    st.text(max_size=40),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.binary(max_size=40),
)


def _lane() -> Lane:
    return Lane(aioredis.Redis())  # never connects: packing only


def _decoded(value: Any) -> Any:
    return value


@given(
    script=st.sampled_from(SCRIPTS),
    keys=st.lists(st.text(min_size=1, max_size=20), min_size=1, max_size=3),
    args=st.lists(arg, min_size=0, max_size=12),
    head=st.integers(min_value=0, max_value=14),
)
def test_a_call_packs_to_the_bytes_of_the_whole_command(
    script: Script, keys: list[str], args: list[Any], head: int
) -> None:
    lane = _lane()
    call = Call(script, keys, args, _decoded, head)
    whole = pack_call(script, keys, args)
    assert lane.pack(call) == whole
    assert lane.pack(call) == whole  # again, from the kept head


def test_calls_that_share_a_head_differ_in_their_tails_only() -> None:
    lane = _lane()
    script = SCRIPTS[0]
    head: list[ScriptArg] = ["1000", "", 100_000, "tw:wake", 7, "", 0]
    calls = [
        Call(script, ["{tw:7}meta", "{tw:7}events"], [*head, f"id{i}", i], _decoded, 7)
        for i in range(3)
    ]
    for call in calls:
        assert lane.pack(call) == pack_call(call.script, call.keys, call.args)
    assert len(lane._heads) == 1


def test_the_kept_heads_are_bounded(monkeypatch: Any) -> None:
    monkeypatch.setattr(pipeline, "HEADS_KEPT", 3)
    lane = _lane()
    for shard in range(10):
        call = Call(SCRIPTS[0], [f"{{tw:{shard}}}meta"], [shard, "x"], _decoded, 1)
        assert lane.pack(call) == pack_call(call.script, call.keys, call.args)
        assert len(lane._heads) <= 3
