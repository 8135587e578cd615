"""The audit's kinds agree everywhere they are written: the Lua operations that find
them, the Python enum, the operators' page; and the report renders them."""

from __future__ import annotations

import re
from pathlib import Path

from timewheel import ids
from timewheel.audit.findings import FOUND_IN_PYTHON, REASONS, REPAIRS, SUMMARY, Finding, Kind
from timewheel.audit.passes import AuditReport
from timewheel.audit.report import render, to_json
from timewheel.audit.shard import Examined
from timewheel.store.library import lua_dir

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "operations" / "auditing.md"


def _lua_sources() -> dict[str, str]:
    return {p.name: p.read_text() for p in lua_dir().glob("audit_*.lua")}


def test_every_kind_the_lua_side_reports_is_a_kind_and_every_kind_is_reported() -> None:
    found: set[str] = set()
    for source in _lua_sources().values():
        found.update(re.findall(r"audit_add\(out, '(\w+)'", source))
    assert found == {k.value for k in Kind if k not in FOUND_IN_PYTHON}
    reasons: set[str] = set()
    for source in [*_lua_sources().values(), (lua_dir() / "lib" / "audit.lua").read_text()]:
        reasons.update(re.findall(r"'(unowned|rate_held|backlog|unwatched|unknown)'", source))
    assert reasons == set(REASONS)


def test_every_kind_is_summed_up_and_explained_for_operators() -> None:
    assert set(SUMMARY) == set(Kind)
    assert set(REPAIRS) <= set(Kind)
    page = PAGE.read_text()
    for kind in Kind:
        assert f"### `{kind.value}`" in page, kind
    for reason in REASONS:
        assert f"`{reason}`" in page, reason


def test_the_body_hashes_the_audit_reads_are_those_ids_choose() -> None:
    """lib/bodies.lua names and places body hashes by the id alphabet's characters and
    their values (its tables are literals: a library loads without the string module)."""
    source = (lua_dir() / "lib" / "bodies.lua").read_text()
    chars = dict(re.findall(r"\[(\d+)\] = '(\w)'", source))
    assert "".join(chars[str(i)] for i in range(32)) == ids.ALPHABET
    values = re.search(r"VALUE = \{(.*?)\}", source, re.DOTALL)
    assert values is not None
    pairs = {int(b): int(v) for b, v in re.findall(r"\[(\d+)\] = (\d+)", values.group(1))}
    assert pairs == {ord(c): i for i, c in enumerate(ids.ALPHABET)}


def _report(findings: list[Finding]) -> AuditReport:
    counts: dict[Kind, int] = {}
    for f in findings:
        counts[f.kind] = counts.get(f.kind, 0) + 1
    return AuditReport(
        pass_id="p",
        shards=[0, 1],
        seconds=1.25,
        finished_ms=1,
        examined=Examined(records=10, entries=2, members=8, schedules=1, keys=4, calls=9),
        counts=counts,
        reasons={Kind.OVERDUE: {"unowned": 1}} if Kind.OVERDUE in counts else {},
        findings=findings,
        truncated=False,
        repairs={Kind.NOT_IN_WHEEL: {"repaired": 1}} if Kind.NOT_IN_WHEEL in counts else {},
    )


def test_the_report_as_a_table_and_as_json() -> None:
    findings = [
        Finding(Kind.NOT_IN_WHEEL, 1, "acme", "0011111111111111", "in no level", data="0"),
        Finding(Kind.OVERDUE, 0, "beta", "0002222222222222", "due 5", reason="unowned"),
    ]
    report = _report(findings)
    text = render(report, limit=1)
    lines = text.splitlines()
    assert lines[0].split() == ["KIND", "SHARD", "TENANT", "ID", "REASON", "DETAIL"]
    assert lines[1].split()[:4] == ["not_in_wheel", "1", "acme", "0011111111111111"]
    assert "1 more not shown" in text
    assert "overdue" in text and "unowned 1" in text and "repaired 1" in text
    doc = to_json(report, limit=5)
    assert doc["clean"] is False and doc["findings_total"] == 2
    assert doc["findings"][1] == {
        "kind": "overdue",
        "shard": 0,
        "tenant": "beta",
        "id": "0002222222222222",
        "detail": "due 5",
        "reason": "unowned",
    }
    assert "data" not in doc["findings"][0]
    clean = render(_report([]), limit=10)
    assert "clean: no finding" in clean and "KIND" not in clean
