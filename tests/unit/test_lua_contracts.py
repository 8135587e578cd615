"""Contracts of the Lua sources, read from the files: headers, return codes, record
layout, includes, and a library version that follows the sources."""

from __future__ import annotations

import itertools
import re
import shutil
from pathlib import Path

import pytest

from timewheel.errors import ConfigError
from timewheel.store.library import (
    LIBS,
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


_LUA_NOISE = re.compile(r"--\[\[.*?\]\]|--[^\n]*|'[^'\n]*'|\"[^\"\n]*\"", re.DOTALL)


def _lua_code(source: str) -> str:
    """Lua source without its comments and with empty strings: only names that are code."""
    return _LUA_NOISE.sub(lambda m: "" if m.group().startswith("--") else "''", source)


def _lib_names() -> dict[str, set[str]]:
    """{lib: the names its top level defines (local functions and locals)}."""
    out: dict[str, set[str]] = {}
    for lib in LIBS:
        code = _lua_code((lua_dir() / "lib" / f"{lib}.lua").read_text())
        names = set(re.findall(r"^local function (\w+)", code, re.MULTILINE))
        for lhs in re.findall(r"^local ([\w, ]+?) =", code, re.MULTILINE):
            names.update(name.strip() for name in lhs.split(","))
        out[lib] = names
    return out


def _libs_used(source: str, names: dict[str, set[str]], own: str = "") -> set[str]:
    words = set(re.findall(r"\b[A-Za-z_]\w*\b", _lua_code(source)))
    return {lib for lib, defined in names.items() if lib != own and words & defined}


def test_every_helper_file_is_in_the_library_after_the_helpers_it_calls() -> None:
    assert sorted(LIBS) == sorted(p.stem for p in (lua_dir() / "lib").glob("*.lua"))
    names = _lib_names()
    for position, lib in enumerate(LIBS):
        source = (lua_dir() / "lib" / f"{lib}.lua").read_text()
        for used in _libs_used(source, names, own=lib):
            # A local function defined further down is a nil global where it is called.
            assert LIBS.index(used) < position, f"lib/{lib}.lua calls lib/{used}.lua"


def test_every_helper_file_opens_with_the_functions_it_provides() -> None:
    for lib in LIBS:
        source = (lua_dir() / "lib" / f"{lib}.lua").read_text()
        header = "\n".join(
            itertools.takewhile(lambda line: line.startswith("--"), source.split("\n"))
        )
        for name in re.findall(r"^local function (\w+)", source, re.MULTILINE):
            assert name in header, f"lib/{lib}.lua: its header does not name {name}"


def test_include_lines_name_exactly_the_helpers_an_operation_calls() -> None:
    names = _lib_names()
    for op in OPERATIONS:
        source = (lua_dir() / f"{op}.lua").read_text()
        included = {Path(m).stem for m in re.findall(r"^--!include (\S+)", source, re.MULTILINE)}
        used = _libs_used(source, names)
        assert included == used, f"{op}.lua includes {sorted(included)}, calls {sorted(used)}"


def test_argv_values_are_named_before_the_script_body() -> None:
    """Every ARGV[n] is read once, in the locals that open a script (before its
    --!include lines), so a body reads by name."""
    opening_ends = re.compile(r"^(--!include|(?!local |--|\s|$))")
    for op in OPERATIONS:
        lines = (lua_dir() / f"{op}.lua").read_text().split("]]", 1)[1].split("\n")
        end = next((i for i, line in enumerate(lines) if opening_ends.match(line)), len(lines))
        opening = re.findall(r"ARGV\[\d+\]", _lua_code("\n".join(lines[:end])))
        late = re.findall(r"ARGV\[\d+\]", _lua_code("\n".join(lines[end:])))
        assert not late, f"{op}.lua reads {late} in its body"
        assert len(opening) == len(set(opening)), f"{op}.lua reads an ARGV value twice"


# Commands that belong to one shared piece of logic: only its helper files issue them.
_ONE_HOME = {
    "'PUBLISH'": ["wake.lua"],  # the scheduler's wake-up
    "'tokens'": ["rate.lua"],  # the dispatch rates' token buckets
    # draining wheel and expiry buckets; the audit's bounded reads of hashes
    "'HSCAN'": ["audit.lua", "wheel.lua"],
    "'use:'": ["usage.lua"],  # what a tenant holds, counted for its limits
}


def test_each_shared_piece_of_logic_is_written_once() -> None:
    sources = {p.name: p.read_text() for p in lua_dir().glob("*.lua")}
    sources.update({p.name: p.read_text() for p in (lua_dir() / "lib").glob("*.lua")})
    for needle, homes in _ONE_HOME.items():
        found = sorted(name for name, text in sources.items() if needle in text)
        assert found == homes, f"{needle} is in {found}, not only in lib/{homes}"


def test_the_library_version_follows_the_sources(tmp_path: Path) -> None:
    shutil.copytree(lua_dir(), tmp_path / "lua")
    before = Library.build(tmp_path / "lua")
    assert Library.build(tmp_path / "lua") == before
    tick = tmp_path / "lua" / "dispatch_tick.lua"
    tick.write_text(tick.read_text() + "\n-- changed\n")
    after = Library.build(tmp_path / "lua")
    assert after.version != before.version and after.name != before.name
