"""Contracts of the Lua sources: headers, return codes, record layout, loading."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from timewheel.engine import Engine
from timewheel.errors import ConfigError
from timewheel.store.library import (
    OPERATIONS,
    Library,
    ScriptCode,
    function_name,
    header_codes,
    lua_dir,
)
from timewheel.store.record import FIELDS
from timewheel.tasks.model import NewTask
from timewheel.testing.settings import test_settings
from timewheel.types import TaskState


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


def test_includes_are_resolved_and_helpers_read_no_keys_or_argv(tmp_path: Path) -> None:
    assert "--!include" not in Library.build().source
    shutil.copytree(lua_dir(), tmp_path / "lua")
    tick = tmp_path / "lua" / "dispatch_tick.lua"
    tick.write_text(tick.read_text().replace("--!include lib/record.lua", "--!include lib/x.lua"))
    with pytest.raises(ConfigError, match=r"tick\.lua includes"):
        Library.build(tmp_path / "lua")
    for lib in (lua_dir() / "lib").glob("*.lua"):
        text = lib.read_text()
        assert "KEYS[" not in text and "ARGV[" not in text, lib.name


async def test_the_library_loads_and_each_operation_is_one_of_its_functions(
    standalone_url: str,
) -> None:
    library = Library.build()
    client = aioredis.Redis.from_url(standalone_url)
    try:
        await library.load(client)
        await library.load(client)  # a second load of the same version is not an error
        listed: Any = await client.execute_command(  # type: ignore[no-untyped-call]
            "FUNCTION", "LIST", "LIBRARYNAME", library.name
        )
        [entry] = [e for e in listed if _field(e, b"library_name") == library.name.encode()]
        names = {_field(f, b"name").decode() for f in _field(entry, b"functions")}
        assert names == {function_name(library.version, op) for op in OPERATIONS}
    finally:
        await client.aclose()


def test_the_library_version_follows_the_sources(tmp_path: Path) -> None:
    shutil.copytree(lua_dir(), tmp_path / "lua")
    before = Library.build(tmp_path / "lua")
    assert Library.build(tmp_path / "lua") == before
    tick = tmp_path / "lua" / "dispatch_tick.lua"
    tick.write_text(tick.read_text() + "\n-- changed\n")
    after = Library.build(tmp_path / "lua")
    assert after.version != before.version and after.name != before.name


async def test_a_server_without_the_library_gets_it_on_first_call(standalone_url: str) -> None:
    """After a FUNCTION FLUSH (a new or emptied server) a call loads the library and
    runs once, alone and in a pipeline."""
    engine = await Engine.connect(test_settings(standalone_url, shards=1))
    try:
        await engine.client.execute_command("FUNCTION", "FLUSH")
        [made] = await engine.tasks.create_many([NewTask(tenant="a", delay_ms=60_000)])
        assert (await engine.tasks.get("a", made.task_id)).state == "scheduled"
        await engine.client.execute_command("FUNCTION", "FLUSH")
        await engine.tasks.cancel("a", made.task_id)
        assert (await engine.tasks.get("a", made.task_id)).state == "cancelled"
    finally:
        await engine.close()


def _field(entry: Any, name: bytes) -> Any:
    """A field of a FUNCTION LIST reply: a dict (redis-py's callback) or a flat list."""
    if isinstance(entry, dict):
        return entry.get(name, entry.get(name.decode()))
    pairs = dict(zip(entry[::2], entry[1::2], strict=True))
    return pairs[name]
