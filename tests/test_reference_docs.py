"""The documentation stays true to the tree: the generated reference pages match the code."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def _reference_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reference", ROOT / "tools" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_reference_is_current() -> None:
    stale: list[Path] = _reference_tool().stale()
    names = ", ".join(str(p.relative_to(ROOT)) for p in stale)
    assert not stale, (
        f"{names} out of date with the code: run `python tools/reference.py` and commit"
    )
