"""The audit: proving that no scheduled run was dropped or stuck (docs/operations/auditing.md).

Python drives read-only Lua operations (lua/audit_*.lua) shard by shard in bounded steps
(shard.py, passes.py); they check every record, wheel member, ready-stream entry and
schedule in Redis and send back only findings and cursors (calls.py, findings.py). The
safe repairs are repair.py; report.py renders a pass's report.
"""

from timewheel.audit.calls import AuditOptions
from timewheel.audit.findings import Finding, Kind
from timewheel.audit.passes import AuditPass, AuditReport

__all__ = ["AuditOptions", "AuditPass", "AuditReport", "Finding", "Kind"]
