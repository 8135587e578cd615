"""`timewheel audit` as an operator runs it: a broken deployment exits 1 naming each
finding, --repair mends what it may and the next run exits 0; usage errors exit 2."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

from timewheel.audit.findings import REPAIRS, Kind
from timewheel.engine import Engine
from timewheel.store.server import RedisServer
from timewheel.tasks.model import NewTask
from timewheel.testing.audit import Faults, break_deployment
from timewheel.testing.settings import test_settings
from timewheel.types import text

CLI = [sys.executable, "-m", "timewheel.cli", "audit"]


def _audit(url: str, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TIMEWHEEL_PREFIX": prefix}
    return subprocess.run(
        [*CLI, "--redis-url", url, *args], env=env, capture_output=True, text=True, timeout=60
    )


def _broken(url: str, *, repairable_only: bool) -> tuple[str, Faults]:
    """A deployment of its own prefix broken on purpose, on Redis's real clock."""
    settings = test_settings(url)

    async def make() -> Faults:
        engine = await Engine.connect(settings)
        try:
            now = int(time.time() * 1000)
            start = now - now % settings.bucket_ms
            return await break_deployment(engine, repairable_only=repairable_only, at_ms=start)
        finally:
            await engine.close()

    return settings.prefix, asyncio.run(make())


def test_findings_exit_1_with_kinds_and_ids_and_json(redis_standalone: RedisServer) -> None:
    url = redis_standalone.url
    prefix, faults = _broken(url, repairable_only=False)
    run = _audit(url, prefix, "--json")
    assert run.returncode == 1, run.stderr
    report: dict[str, Any] = json.loads(run.stdout)
    assert not report["clean"]
    assert {(f["kind"], f["id"]) for f in report["findings"]} == faults.expected
    assert sum(report["counts"].values()) == report["findings_total"] == len(faults.expected)
    assert report["examined"]["records"] > 0
    assert "audit_findings" in run.stderr and "audit_pass" in run.stderr  # the log lines

    table = _audit(url, prefix, "--limit", "3")
    assert table.returncode == 1
    lines = table.stdout.splitlines()
    assert lines[0].split()[:4] == ["KIND", "SHARD", "TENANT", "ID"]
    assert len([line for line in lines[1:] if line and line.split()[0] in set(Kind)]) >= 3
    assert f"{len(faults.expected) - 3} more not shown" in table.stdout
    for kind in {k for k, _ in faults.expected}:
        assert kind in table.stdout


def test_repair_then_a_clean_audit_exits_0(redis_standalone: RedisServer) -> None:
    url = redis_standalone.url
    prefix, faults = _broken(url, repairable_only=True)
    # usage_mismatch is checked with --events only: test_usage_fields_found_and_repaired
    assert {Kind(k) for k, _ in faults.expected} == set(REPAIRS) - {Kind.USAGE_MISMATCH}
    repaired = _audit(url, prefix, "--repair", "--json")
    assert repaired.returncode == 1, repaired.stderr  # it found what it then repaired
    report = json.loads(repaired.stdout)
    assert {k: v.get("repaired") for k, v in report["repairs"].items()} == {
        k: n for k, n in report["counts"].items()
    }
    assert repaired.stderr.count("audit_repair") == len(faults.expected)
    clean = _audit(url, prefix)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "clean: no finding" in clean.stdout


def _usage_broken(url: str) -> tuple[str, int, dict[str, int]]:
    """Tasks of acme in two queues, then its q:mail count and its bytes count made wrong in
    their shard: the prefix, the shard and the true counts."""
    settings = test_settings(url)

    async def make() -> tuple[int, dict[str, int]]:
        engine = await Engine.connect(settings)
        try:
            made = [
                await engine.tasks.create(
                    NewTask("acme", queue=queue, payload_json='"p"', delay_ms=3_600_000)
                )
                for queue in ("mail", "mail", "sms")
            ]
            shard = engine.store.locate(made[0].task_id)
            ukey = engine.keys.usage(shard, "acme")
            raw: Any = await engine.client.hgetall(ukey)
            held = {text(k): int(v) for k, v in raw.items()}
            await engine.client.hincrby(ukey, "q:mail", 5)
            await engine.client.hset(ukey, "bytes", 1)
            return shard, held
        finally:
            await engine.close()

    shard, held = asyncio.run(make())
    return settings.prefix, shard, held


def test_usage_fields_found_and_repaired(redis_url: str) -> None:
    prefix, shard, held = _usage_broken(redis_url)
    mail, size = held["q:mail"], held["bytes"]
    assert mail > 0 and size > 1, held
    run = _audit(redis_url, prefix, "--events", "--json")
    assert run.returncode == 1, run.stderr
    report: dict[str, Any] = json.loads(run.stdout)
    assert sorted(
        (f["kind"], f["shard"], f["tenant"], f["id"], f["detail"]) for f in report["findings"]
    ) == [
        ("usage_mismatch", shard, "acme", "bytes",
         f"use:acme bytes: the records give {size}, the hash counts 1"),
        ("usage_mismatch", shard, "acme", "q:mail",
         f"use:acme q:mail: the records give {mail}, the hash counts {mail + 5}"),
    ]  # fmt: skip
    assert _audit(redis_url, prefix).returncode == 0  # without --events: not checked

    repaired = _audit(redis_url, prefix, "--events", "--repair", "--json")
    assert repaired.returncode == 1, repaired.stderr
    assert json.loads(repaired.stdout)["repairs"] == {"usage_mismatch": {"repaired": 2}}
    assert repaired.stderr.count("audit_repair") == 2
    assert "lua/repair_usage.lua" in repaired.stderr
    clean = _audit(redis_url, prefix, "--events")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "clean: no finding" in clean.stdout


def test_usage_errors_exit_2(redis_standalone: RedisServer) -> None:
    url = redis_standalone.url
    prefix, _ = _broken(url, repairable_only=True)
    for args in (
        ["--shard", "99"],
        ["--overdue-s", "-1"],
        ["--limit", "-1"],
        ["--nope"],
        ["--archiver-behind-s", "5"],  # without --archive
    ):
        run = _audit(url, prefix, *args)
        assert run.returncode == 2, (args, run.stdout, run.stderr)
    nobody = _audit(url, "no-such-prefix")
    assert nobody.returncode == 2 and "no timewheel deployment" in nobody.stderr
    one = _audit(url, prefix, "--shard", "0", "--shard", "0", "--json")
    assert json.loads(one.stdout)["shards"] == [0]
