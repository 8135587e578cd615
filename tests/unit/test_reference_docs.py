"""The documentation stays true to the tree: the generated reference pages match the code,
and every relative link in README.md and docs/ leads to a file (and heading) that exists."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)", re.MULTILINE)
IMAGE = re.compile(r"!\[[^\]]*\]\(\s*([^)\s]+)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


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


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    text = CODE_SPAN.sub(lambda m: m.group(0)[1:-1], heading).strip().lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link keeps its text
    kept = "".join(c for c in text if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        base = _slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def _targets(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    text = CODE_SPAN.sub("", text)
    return LINK.findall(text) + REF_LINK.findall(text) + IMAGE.findall(text)


def _broken(page: Path) -> list[str]:
    out = []
    for target in _targets(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            out.append(f"{target} (no file {dest.relative_to(ROOT)})")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            out.append(f"{target} (no heading #{anchor} in {dest.relative_to(ROOT)})")
    return out


def test_pages_are_found() -> None:
    assert ROOT / "README.md" in PAGES
    assert len(PAGES) > 10, "docs/ should hold the manual"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = _broken(page)
    assert not broken, f"{page.relative_to(ROOT)} links to what does not exist: {broken}"


def test_no_design_brief_outside_the_repository() -> None:
    """The design of record is docs/design.md: no page cites a DESIGN.md or its sections."""
    cites = re.compile(r"DESIGN\.md|\bsections? \d+\b|§\s?\d+")
    found = [
        f"{page.relative_to(ROOT)}:{n}"
        for page in PAGES
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if cites.search(line)
    ]
    assert not found, f"cite docs/design.md instead: {found}"
