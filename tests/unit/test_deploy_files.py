"""The operators' files of deploy/, checked with the tools that read them.

The alert rules pass `promtool check rules` and their unit tests (`promtool test rules`);
every alert has a severity, a summary, a description and a runbook section that exists.
The rules and the Grafana dashboard read only metrics that docs/operations/metrics.md
lists, and the dashboard's PromQL parses. The redis-cli scripts pass shellcheck and are
each described in docs/operations/redis-cli.md. promtool and shellcheck are installed by
.ci/bootstrap; a missing one fails these tests.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from timewheel.api.metrics import ApiMetrics
from timewheel.dispatch.metrics import SchedulerMetrics

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "timewheel.json"
REDIS_CLI = ROOT / "deploy" / "redis-cli"
DOCS = ROOT / "docs"
METRICS_DOC = DOCS / "operations" / "metrics.md"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed; .ci/bootstrap installs it")
    return path


def _run(args: list[str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


# --- alert rules ---------------------------------------------------------------------------


@cache
def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text(encoding="utf-8"))
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_the_alert_rules_pass_promtool_check() -> None:
    done = _run([_tool("promtool"), "check", "rules", "alerts.yml"], cwd=PROMETHEUS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in done.stdout


def test_the_alert_rules_pass_their_unit_tests() -> None:
    done = _run([_tool("promtool"), "test", "rules", "alerts_test.yml"], cwd=PROMETHEUS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_is_shown_firing_by_a_unit_test() -> None:
    tests = yaml.safe_load((PROMETHEUS / "alerts_test.yml").read_text(encoding="utf-8"))
    firing = {
        case["alertname"]
        for test in tests["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert {rule["alert"] for rule in _rules()} == firing


def _anchor(heading: str) -> str:
    """The anchor a Markdown heading gets (GitHub's rule, for the headings used here)."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    return {
        _anchor(line.lstrip("#"))
        for line in doc.read_text(encoding="utf-8").splitlines()
        if line.startswith("#")
    }


def test_every_alert_has_a_severity_a_summary_a_description_and_a_runbook() -> None:
    for rule in _rules():
        name = rule["alert"]
        assert re.fullmatch(r"Timewheel[A-Za-z]+", name), name
        assert rule["labels"]["severity"] in {"critical", "warning"}, name
        notes = rule["annotations"]
        assert set(notes) == {"summary", "description", "runbook_url"}, name
        assert notes["summary"].strip() and notes["description"].strip(), name
        page, _, anchor = notes["runbook_url"].partition("#")
        assert page.startswith("docs/operations/"), name
        doc = ROOT / page
        assert doc.is_file(), f"{name}: {page} does not exist"
        assert anchor in _anchors(doc), f"{name}: no section #{anchor} in {page}"


# --- metric names ---------------------------------------------------------------------------


@cache
def _documented() -> dict[str, str]:
    """metric -> type, from the tables of docs/operations/metrics.md."""
    row = re.compile(r"^\| `([a-z_:][a-z0-9_:]*)` \| (counter|gauge|histogram) \|", re.M)
    return dict(row.findall(METRICS_DOC.read_text(encoding="utf-8")))


def _series_names() -> set[str]:
    """Every series name a documented metric shows in the exposition."""
    out: set[str] = set()
    for name, kind in _documented().items():
        if kind == "histogram":
            out |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        elif kind == "counter":
            out |= {name, name.removesuffix("_total") + "_created"}
        else:
            out.add(name)
    return out


_PROMQL_WORDS = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right"}
    | {"bool", "offset", "inf", "nan", "Inf", "NaN"}
)
_STRIPPED = (
    r'"(?:[^"\\]|\\.)*"',  # strings
    r"\{[^}]*\}",  # label matchers
    r"\[[^\]]*\]",  # range and subquery windows
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)",  # label lists
    r"\$\{?\w+\}?",  # Grafana variables
)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers that are not functions,
    keywords, label names or numbers."""
    text = expr
    for pattern in _STRIPPED:
        text = re.sub(pattern, " ", text)
    names = set()
    for m in re.finditer(r"(?<![\w.])[A-Za-z_:][A-Za-z0-9_:]*", text):
        rest = text[m.end() :].lstrip()
        if m.group() not in _PROMQL_WORDS and not rest.startswith("("):
            names.add(m.group())
    return names


def test_the_metric_name_check_sees_what_an_expression_reads() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (tenant, le) (rate(x_bucket{tenant=~"$tenant"}'
        '[$__rate_interval]))) > 1e3 and on (shard) y offset 5m or time() - z{a="b(c)"}'
    )
    assert metric_names(expr) == {"x_bucket", "y", "z"}
    assert metric_names("label_values(timewheel_dispatched_runs_total, tenant)") == {
        "timewheel_dispatched_runs_total",
        "tenant",
    }


def test_every_metric_the_processes_register_is_documented_with_its_type() -> None:
    exported: dict[str, str] = {}
    for registry in (SchedulerMetrics().registry, ApiMetrics().registry):
        for family in registry.collect():
            name = family.name + ("_total" if family.type == "counter" else "")
            exported[name] = family.type
    documented = _documented()
    assert {name: documented.get(name) for name in exported} == exported


def test_the_alert_rules_read_only_documented_metrics() -> None:
    known = _series_names()
    for rule in _rules():
        names = metric_names(rule["expr"])
        assert names, rule["alert"]
        assert names <= known, f"{rule['alert']}: not in metrics.md: {sorted(names - known)}"


# --- the dashboard ------------------------------------------------------------------------------


@cache
def _dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return data


def _panels() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for panel in _dashboard()["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def _expressions() -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and template variable query."""
    out = [
        (f"panel {p['title']!r}", target["expr"])
        for p in _panels()
        for target in p.get("targets", [])
    ]
    for var in _dashboard()["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            out.append((f"variable {var['name']}", query))
    return out


def test_the_dashboard_reads_only_documented_metrics() -> None:
    known = _series_names() | {"tenant"}  # label_values(metric, label) names a label
    read: set[str] = set()
    for where, expr in _expressions():
        names = metric_names(expr)
        assert names, f"{where}: {expr}"
        assert names <= known, f"{where}: not in metrics.md: {sorted(names - known)}"
        read |= names
    # every metric of the page is on the dashboard
    shown = {re.sub(r"_(bucket|sum|count)$", "", name) for name in read}
    assert set(_documented()) - shown == set()


def test_the_dashboard_promql_parses(tmp_path: Path) -> None:
    """promtool parses each expression, as a recording rule, with Grafana's variables
    replaced by values."""
    rules = [
        {
            "record": f"dashboard:expr_{i}",
            "expr": expr.replace("$__rate_interval", "5m").replace("$tenant", ".*"),
        }
        for i, (_, expr) in enumerate(_expressions())
        if not expr.startswith("label_values(")
    ]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = _run([_tool("promtool"), "check", "rules", str(path)])
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules)} rules found" in done.stdout


def test_the_dashboard_panels_are_laid_out_and_use_the_datasource_variable() -> None:
    dash = _dashboard()
    assert dash["uid"] == "timewheel"
    names = [v["name"] for v in dash["templating"]["list"]]
    assert names[0] == "datasource"
    panels = _panels()
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for p in panels:
        pos = p["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, p["title"]
        mine = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not mine & cells, f"panel {p['title']!r} overlaps another"
        cells |= mine
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}", p["title"]
            assert p["targets"], p["title"]


# --- redis-cli scripts ------------------------------------------------------------------------


def _scripts() -> list[Path]:
    return sorted(p for p in REDIS_CLI.iterdir() if p.is_file())


def test_the_redis_cli_scripts_pass_shellcheck() -> None:
    scripts = _scripts()
    assert len(scripts) >= 7
    for script in scripts:
        assert script.read_text(encoding="utf-8").startswith("#!/usr/bin/env bash\n"), script
        assert script.stat().st_mode & 0o111, f"{script} is not executable"
    files = [str(p) for p in [*scripts, *sorted((REDIS_CLI / "lib").glob("*.bash"))]]
    done = _run([_tool("shellcheck"), "--external-sources", "--source-path=SCRIPTDIR", *files])
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_redis_cli_script_and_snippet_is_documented() -> None:
    page = (DOCS / "operations" / "redis-cli.md").read_text(encoding="utf-8")
    for script in _scripts():
        assert f"\n## {script.name}\n" in page, f"{script.name} has no section in redis-cli.md"
    used = {
        name
        for script in _scripts()
        for name in re.findall(r"tw_eval (\w+)", script.read_text(encoding="utf-8"))
    } | {"layout", "common", "nodes"}
    snippets = {p.stem for p in (REDIS_CLI / "lua").glob("*.lua")}
    assert snippets == used, "a snippet no script runs, or a script runs a missing one"
