"""The suite's own rules, read from its sources: no test module imports another (what
tests share lives in timewheel.testing, which timewheel itself never imports), test
modules sit in the four folders, and every test asserts something."""

from __future__ import annotations

import ast
import importlib.util
from functools import cache
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
FOLDERS = ("unit", "lua", "integration", "process")
MODULES = sorted(TESTS.rglob("*.py"))
TEST_MODULES = [p for p in MODULES if p.name.startswith("test_")]


def _name(path: Path) -> str:
    return str(path.relative_to(TESTS.parent))


def _imported(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, module) of every import; a relative import keeps its leading dots."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            out.append((node.lineno, "." * node.level + (node.module or "")))
    return out


def _is_test_module(module: str) -> bool:
    return (
        module.startswith(".")
        or module == "tests"
        or module.startswith("tests.")
        or module.split(".")[-1].startswith(("test_", "conftest"))
    )


def test_the_suite_is_laid_out_in_its_four_folders() -> None:
    assert {p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(
        FOLDERS
    )
    stray = [_name(p) for p in TEST_MODULES if p.parent.name not in FOLDERS]
    assert not stray, f"test modules outside tests/<{'|'.join(FOLDERS)}>/: {stray}"


def test_no_test_module_imports_another() -> None:
    found = [
        f"{_name(path)}:{line} imports {module}"
        for path in MODULES
        for line, module in _imported(ast.parse(path.read_text(encoding="utf-8")))
        if _is_test_module(module)
    ]
    assert not found, f"move what is shared to timewheel/testing/: {found}"


def test_the_import_check_sees_every_way_to_import_a_test_module() -> None:
    source = (
        "import tests.lua.test_engine\n"
        "from tests.unit import test_fire_times\n"
        "from . import test_api\n"
        "from .conftest import thing\n"
        "import test_schedules\n"
        "from tests import conftest\n"
        "import timewheel.testing.clock\n"
        "from timewheel.testing.dispatch import prime\n"
    )
    flagged = [m for _, m in _imported(ast.parse(source)) if _is_test_module(m)]
    assert flagged == [
        "tests.lua.test_engine",
        "tests.unit",
        ".",
        ".conftest",
        "test_schedules",
        "tests",
    ]


@cache
def _functions(path: Path) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    }


@cache
def _helper_sources(path: Path) -> dict[str, Path]:
    """Names a module imports from timewheel.testing, and the file each comes from."""
    out: dict[str, Path] = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("timewheel.testing"):
            spec = importlib.util.find_spec(node.module or "")
            if spec is not None and spec.origin is not None:
                out.update((alias.asname or alias.name, Path(spec.origin)) for alias in node.names)
    return out


_CHECKS = {"raises", "warns", "fail"}
"""pytest.raises, pytest.warns and pytest.fail check as an assert does."""


def _call_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _checks(path: Path, func: ast.AST, seen: set[tuple[Path, str]]) -> bool:
    """Whether `func` asserts: an assert statement, raise AssertionError, pytest.raises/
    warns/fail, an assert_* helper, or a call of a function of its module or of
    timewheel.testing that does one of these."""
    for node in ast.walk(func):
        if isinstance(node, ast.Assert):
            return True
        if isinstance(node, ast.Raise) and "AssertionError" in ast.unparse(node):
            return True
        if isinstance(node, ast.Call):
            name = _call_name(node)
            if name in _CHECKS or name.startswith("assert_") or name == "call_and_validate":
                return True
            where = path if name in _functions(path) else _helper_sources(path).get(name)
            if where is not None and (where, name) not in seen:
                seen.add((where, name))
                callee = _functions(where).get(name)
                if callee is not None and _checks(where, callee, seen):
                    return True
    return False


def _tests(path: Path) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        n
        for n in tree.body
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test_")
    ]


def test_every_test_asserts_something() -> None:
    silent = [
        f"{_name(path)}::{test.name}"
        for path in TEST_MODULES
        for test in _tests(path)
        if not _checks(path, test, set())
    ]
    assert not silent, f"tests that check nothing: {silent}"


def test_the_assert_check_tells_a_silent_test(tmp_path: Path) -> None:
    module = tmp_path / "test_sample.py"
    module.write_text(
        "import pytest\n"
        "def helper(x):\n    assert x\n"
        "def quiet(x):\n    return x\n"
        "def test_direct():\n    assert 1\n"
        "def test_raises():\n    with pytest.raises(ValueError):\n        int('x')\n"
        "def test_through_a_helper():\n    helper(1)\n"
        "def test_silent():\n    quiet(1)\n",
        encoding="utf-8",
    )
    silent = [t.name for t in _tests(module) if not _checks(module, t, set())]
    assert silent == ["test_silent"]


def test_timewheel_itself_never_imports_its_testing_package() -> None:
    """timewheel.testing needs pytest; the package users install must run without it."""
    package = TESTS.parent / "timewheel"
    found = [
        f"{path.relative_to(TESTS.parent)}:{line}"
        for path in sorted(package.rglob("*.py"))
        if path.relative_to(package).parts[0] != "testing"
        for line, module in _imported(ast.parse(path.read_text(encoding="utf-8")))
        if module == "timewheel.testing" or module.startswith("timewheel.testing.")
    ]
    assert not found, f"timewheel imports timewheel.testing: {found}"
