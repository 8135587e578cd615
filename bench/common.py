"""Helpers the bench scripts share: percentiles, a scheduler process, the dispatched runs,
callgrind control."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from timewheel.config import Settings
from timewheel.engine import Engine


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); 0 for no values."""
    if not values:
        return 0
    ordered = sorted(values)  # linear when already sorted
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def scheduler_process(
    settings: Settings, node: str, log: Path, *args: str
) -> subprocess.Popen[bytes]:
    """`timewheel scheduler --node-id node` on the settings' Redis, prefix and shards, its
    output in `log`; `args` are further flags (e.g. --lease-ttl-ms)."""
    env = {
        **os.environ,
        "TIMEWHEEL_PREFIX": settings.prefix,
        "TIMEWHEEL_SHARDS": str(settings.shards),
        # No continuous audit or canaries (bench/audit.py --continuous measures them):
        # their runs would be in the streams these benches count.
        "TIMEWHEEL_AUDIT_INTERVAL_MS": "0",
    }
    command = [sys.executable, "-m", "timewheel.cli", "scheduler"]
    command += ["--redis-url", settings.redis_url, "--node-id", node, "--log-json", *args]
    return subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)


async def dispatched_runs(engine: Engine) -> list[tuple[str, int, int]]:
    """(run_id, due_ms, dispatched_ms) of every entry of every ready stream (standalone)."""
    out = []
    async for key in engine.client.scan_iter(
        match=f"{{{engine.settings.prefix}:*}}:q:*", count=1000
    ):
        last = "-"
        while True:
            entries: Any = await engine.client.xrange(key, min=last, max="+", count=10_000)
            if last != "-":
                entries = entries[1:]
            if not entries:
                break
            for _, f in entries:
                out.append((f[b"run_id"].decode(), int(f[b"due_ms"]), int(f[b"dispatched_ms"])))
            last = entries[-1][0].decode()
    return out


class CallgrindControl:
    """callgrind_control on a process that runs under valgrind's callgrind with
    --instr-atstart=no and --callgrind-out-file=<out_dir>/cg.%p: instructions are counted
    only between start() and dump(part) (what the host's load does not change)."""

    def __init__(self, out_dir: Path, pid: int = 0) -> None:
        self.out_dir, self.pid = out_dir, pid

    def control(self, *args: str) -> None:
        subprocess.run(["callgrind_control", *args, str(self.pid)], check=True, capture_output=True)

    def start(self) -> None:
        self.control("-i", "on")
        self.control("-z")

    def dump(self, part: str) -> Path:
        """Dump what was counted since start() as `part`, stop counting; the dump's path."""
        self.control("-d", part)
        self.control("-i", "off")
        dumps = [p for p in self.out_dir.glob("cg.*") if dumped_part(p) == part]
        if len(dumps) != 1:
            raise RuntimeError(f"{len(dumps)} callgrind dumps for {part} in {self.out_dir}")
        return dumps[0]

    def instructions(self, part: str) -> int:
        """dump(part)'s total instructions."""
        m = re.search(r"^totals: (\d+)", self.dump(part).read_text(errors="replace"), re.M)
        if m is None:
            raise RuntimeError(f"no totals in the callgrind dump for {part}")
        return int(m.group(1))


def dumped_part(path: Path) -> str | None:
    """The part a callgrind dump was written for ('dump <part>'), if it is one."""
    with path.open(errors="replace") as f:
        for line in f:
            if line.startswith("desc: Trigger: dump "):
                return line.removeprefix("desc: Trigger: dump ").strip()
            if line.startswith("events:"):
                return None
    return None
