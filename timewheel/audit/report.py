"""A pass's report as `timewheel audit` prints it: a table, or one JSON document."""

from __future__ import annotations

from timewheel.audit.findings import REPAIRS, SUMMARY, Finding
from timewheel.audit.passes import AuditReport
from timewheel.types import JSONValue

COLUMNS = ("kind", "shard", "tenant", "id", "reason", "detail")


def to_json(report: AuditReport, limit: int) -> dict[str, JSONValue]:
    """The report as JSON: counts of everything, the first `limit` findings."""
    shown = report.findings[:limit]
    return {
        "clean": report.clean,
        "pass_id": report.pass_id,
        "shards": report.shards,
        "seconds": round(report.seconds, 3),
        "finished_ms": report.finished_ms,
        "examined": report.examined.to_json(),
        "findings_total": report.total,
        "counts": {kind.value: n for kind, n in report.counts.items()},
        "reasons": {kind.value: dict(reasons) for kind, reasons in report.reasons.items()},
        "findings": [f.to_json() for f in shown],
        "findings_shown": len(shown),
        "repairs": {kind.value: dict(outcomes) for kind, outcomes in report.repairs.items()},
        "tenants": [row.to_json() for row in report.tenants],
    }


def _row(f: Finding) -> tuple[str, ...]:
    return (f.kind.value, str(f.shard), f.tenant or "-", f.id or "-", f.reason or "-", f.detail)


def render(report: AuditReport, limit: int) -> str:
    """The report for a person: the findings as a table (the first `limit`), then what
    was read and the counts by kind, with what each kind means."""
    lines: list[str] = []
    shown = report.findings[:limit]
    if shown:
        rows = [tuple(c.upper() for c in COLUMNS), *(_row(f) for f in shown)]
        widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS) - 1)]
        for r in rows:
            cells = [r[i].ljust(widths[i]) for i in range(len(widths))]
            lines.append("  ".join([*cells, r[-1]]).rstrip())
        if report.total > len(shown):
            lines.append(f"... {report.total - len(shown)} more not shown (--limit)")
        lines.append("")
    e = report.examined
    lines.append(
        f"audited {len(report.shards)} shards in {report.seconds:.1f} s: {e.records:,} "
        f"records, {e.entries:,} ready-stream entries, {e.members:,} wheel members, "
        f"{e.schedules:,} schedules"
    )
    if report.clean:
        lines.append("clean: no finding")
        return "\n".join(lines) + "\n"
    lines.append(f"{report.total:,} findings:")
    width = max(len(kind.value) for kind in report.counts)
    for kind, n in report.counts.items():
        reasons = report.reasons.get(kind)
        why = f" ({', '.join(f'{r} {c:,}' for r, c in reasons.items())})" if reasons else ""
        lines.append(f"  {kind.value.ljust(width)}  {n:>9,}  {SUMMARY[kind]}{why}")
        if kind in report.repairs:
            done = report.repairs[kind]
            busy = f", busy {done['busy']:,}" if done.get("busy") else ""
            lines.append(
                f"  {''.ljust(width)}  {'':>9}  repaired {done.get('repaired', 0):,}"
                f" ({REPAIRS[kind]}), unchanged {done.get('unchanged', 0):,}{busy}"
            )
    return "\n".join(lines) + "\n"
