"""Contracts of the Lua sources: headers, return codes, record layout, loading."""

from __future__ import annotations

import re

import redis.asyncio as aioredis

from timewheel.record import FIELDS, TaskState
from timewheel.scripts import OPERATIONS, Script, ScriptCode, header_codes, lua_dir, render


def test_every_operation_has_a_contract_header() -> None:
    for name in OPERATIONS:
        source = (lua_dir() / f"{name}.lua").read_text()
        assert source.startswith("--[["), name
        header = source.split("]]", 1)[0]
        for part in ("KEYS[1]", "ARGV[1]", "Returns:"):
            assert part in header, f"{name}.lua header lacks {part}"
        # Every KEYS/ARGV index used in the body is documented in the header.
        body = source.split("]]", 1)[1]
        for kind, index in set(re.findall(r"(KEYS|ARGV)\[(\d+)\]", body)):
            assert f"{kind}[{index}]" in header, f"{name}.lua uses {kind}[{index}] undocumented"


def test_header_codes_match_the_python_enum() -> None:
    known = {code.value: code.name for code in ScriptCode}
    seen: set[int] = set()
    for name in OPERATIONS:
        for code, label in header_codes(name).items():
            assert known.get(code) == label, f"{name}.lua: {code} {label}"
            seen.add(code)
    assert seen == set(known), "every ScriptCode is returned by some script"


def _lua_constants(source: str, prefix: str) -> dict[str, int]:
    """{NAME: value} of lines like `local R_A, R_B = 1, 2` (prefix 'R_')."""
    out: dict[str, int] = {}
    pattern = rf"^local ({prefix}[A-Z_, ]+) = ([\d, ]+)$"
    for lhs, rhs in re.findall(pattern, source, re.MULTILINE):
        for label, value in zip(lhs.split(", "), rhs.split(", "), strict=True):
            out[label.removeprefix(prefix)] = int(value)
    return out


def test_record_layout_and_states_match_the_lua_side() -> None:
    source = (lua_dir() / "lib" / "record.lua").read_text()
    positions = _lua_constants(source, "R_")
    renamed = {
        "DUE": "due_ms",
        "CREATED": "created_ms",
        "UPDATED": "updated_ms",
        "ERROR": "last_error",
        "SCHEDULE": "schedule_id",
        "DEAD": "dead_entry",
    }
    assert len(positions) == len(FIELDS)
    for label, index in positions.items():
        assert FIELDS[index - 1] == renamed.get(label, label.lower()), label
    states = _lua_constants(source, "ST_")
    assert states == {state.name: state.value for state in TaskState}


def test_includes_are_inlined_and_helpers_read_no_keys_or_argv() -> None:
    for name in OPERATIONS:
        assert "--!include" not in render(name)
    for lib in (lua_dir() / "lib").glob("*.lua"):
        text = lib.read_text()
        assert "KEYS[" not in text and "ARGV[" not in text, lib.name


async def test_every_script_loads_with_the_sha_we_compute(standalone_url: str) -> None:
    client = aioredis.Redis.from_url(standalone_url)
    try:
        for name in OPERATIONS:
            script = Script.load(name)
            assert await client.script_load(script.source) == script.sha
    finally:
        await client.aclose()
