"""Contracts of the Lua sources, read from the files: headers, return codes, record
layout, includes, and a library version that follows the sources."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from timewheel.errors import ConfigError
from timewheel.store.library import (
    OPERATIONS,
    Library,
    ScriptCode,
    header_codes,
    lua_dir,
)
from timewheel.store.record import FIELDS
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


def test_the_library_version_follows_the_sources(tmp_path: Path) -> None:
    shutil.copytree(lua_dir(), tmp_path / "lua")
    before = Library.build(tmp_path / "lua")
    assert Library.build(tmp_path / "lua") == before
    tick = tmp_path / "lua" / "dispatch_tick.lua"
    tick.write_text(tick.read_text() + "\n-- changed\n")
    after = Library.build(tmp_path / "lua")
    assert after.version != before.version and after.name != before.name
