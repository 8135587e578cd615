"""Scheduler node processes for multi-node tests: `timewheel scheduler` as users run it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from timewheel.config import Settings


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that makes a `timewheel` subprocess use these settings."""
    return {
        **os.environ,
        "TIMEWHEEL_PREFIX": settings.prefix,
        "TIMEWHEEL_SHARDS": str(settings.shards),
        "TIMEWHEEL_BUCKET_MS": str(settings.bucket_ms),
        "TIMEWHEEL_HORIZON_MS": str(settings.horizon_ms),
        "TIMEWHEEL_POLL_CAP_MS": str(settings.poll_cap_ms),
        "TIMEWHEEL_RETRY_INITIAL_MS": str(settings.retry_initial_ms),
        "TIMEWHEEL_VISIBILITY_TIMEOUT_MS": str(settings.visibility_timeout_ms),
        "TIMEWHEEL_REAP_INTERVAL_MS": str(settings.reap_interval_ms),
        "TIMEWHEEL_PLAN_HORIZON_MS": str(settings.plan_horizon_ms),
        "TIMEWHEEL_PLAN_INTERVAL_MS": str(settings.plan_interval_ms),
        "TIMEWHEEL_MISFIRE_MS": str(settings.misfire_ms),
        "TIMEWHEEL_SWEEP_MS": str(settings.sweep_ms),
        "TIMEWHEEL_RETENTION_MS": str(settings.retention_ms),
        "TIMEWHEEL_AUDIT_INTERVAL_MS": str(settings.audit_interval_ms),
        "TIMEWHEEL_AUDIT_STEP_BUDGET": str(settings.audit_step_budget),
        "TIMEWHEEL_AUDIT_MAX_SHARE": str(settings.audit_max_share),
        "TIMEWHEEL_AUDIT_ARCHIVER_BEHIND_MS": str(settings.audit_archiver_behind_ms),
        "TIMEWHEEL_CANARY_INTERVAL_MS": str(settings.canary_interval_ms),
        "TIMEWHEEL_CANARY_DEADLINE_MS": str(settings.canary_deadline_ms),
        "TIMEWHEEL_POSTGRES_DSN": settings.postgres_dsn,
    }


class NodeProcess:
    """One `timewheel scheduler` subprocess with its own log file."""

    def __init__(
        self,
        settings: Settings,
        node_id: str,
        log_dir: Path,
        *,
        ttl_ms: int,
        metrics_port: int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """env: more environment variables (a skewed clock, timewheel/testing/skew.py)."""
        self.node_id = node_id
        self.log_path = log_dir / f"{node_id}.log"
        env = {**settings_env(settings), **(env or {})}
        with self.log_path.open("w") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "timewheel.cli",
                    "scheduler",
                    "--redis-url",
                    settings.redis_url,
                    "--node-id",
                    node_id,
                    "--lease-ttl-ms",
                    str(ttl_ms),
                    "--log-json",
                    *(["--metrics-port", str(metrics_port)] if metrics_port else []),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_started(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while "scheduler_started" not in self.log():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{self.node_id} did not start:\n{self.log()}")
            time.sleep(0.05)

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                return self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                return self.proc.wait()
        return int(self.proc.returncode)


class Fleet:
    """Several scheduler nodes, all stopped on exit."""

    def __init__(self, settings: Settings, log_dir: Path, names: list[str], *, ttl_ms: int = 2000):
        self.nodes = {n: NodeProcess(settings, n, log_dir, ttl_ms=ttl_ms) for n in names}

    def __enter__(self) -> Fleet:
        for node in self.nodes.values():
            node.wait_started()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for node in self.nodes.values():
            node.stop()

    def __getitem__(self, name: str) -> NodeProcess:
        return self.nodes[name]
