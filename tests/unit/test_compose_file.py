"""deploy/docker-compose.yml refers to real things: every timewheel service's command
parses with the `timewheel` parser (flags included), every TIMEWHEEL_* variable is a
setting, mounted files exist, the worker's --app loads, and the services a durable
deployment needs are all there. (`docker compose config` is not run: the machines that
run the suite have no compose plugin, and it would need the network for the images.)"""

from __future__ import annotations

import re
import sys
from dataclasses import fields
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from timewheel.cli.executors import load_handler
from timewheel.cli.parser import build_parser
from timewheel.config import Settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
RUNBOOK = ROOT / "docs" / "operations" / "durability.md"
COMPOSE = DEPLOY / "docker-compose.yml"


@cache
def _compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    return doc


def _services() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = _compose()["services"]
    return services


def _timewheel_services() -> dict[str, dict[str, Any]]:
    return {n: s for n, s in _services().items() if s.get("image") == "timewheel:latest"}


def test_the_services_of_a_durable_deployment_are_there() -> None:
    services = _services()
    assert {"redis", "postgres", "api", "archiver", "worker"} <= set(services)
    commands = {name: s["command"] for name, s in _timewheel_services().items()}
    assert sorted(c[1] for c in commands.values()) == [
        "api",
        "archiver",
        "scheduler",
        "scheduler",
        "worker",
    ]
    nodes = [c[c.index("--node-id") + 1] for c in commands.values() if c[1] == "scheduler"]
    assert len(set(nodes)) == 2, "two scheduler nodes with distinct ids"
    archiver = commands["archiver"]
    assert float(archiver[archiver.index("--snapshot-every") + 1]) > 0


@pytest.mark.parametrize("name", sorted(_timewheel_services()))
def test_each_command_parses_with_the_timewheel_parser(name: str) -> None:
    command = _timewheel_services()[name]["command"]
    assert command[0] == "timewheel"
    args = build_parser().parse_args(command[1:])  # an unknown flag exits 2: the test fails
    assert args.command == command[1]


@pytest.mark.parametrize("name", sorted(_timewheel_services()))
def test_each_service_gets_real_settings_and_both_servers(name: str) -> None:
    env: dict[str, str] = _timewheel_services()[name]["environment"]
    known = {f"TIMEWHEEL_{f.name.upper()}" for f in fields(Settings)}
    assert set(env) <= known
    assert env["TIMEWHEEL_REDIS_URL"] == "redis://redis:6379"
    dsn = re.fullmatch(
        r"postgresql://(\w+):\$\{POSTGRES_PASSWORD[^}]*\}@postgres:5432/(\w+)",
        env["TIMEWHEEL_POSTGRES_DSN"],
    )
    assert dsn is not None, env["TIMEWHEEL_POSTGRES_DSN"]
    postgres_env = _services()["postgres"]["environment"]
    assert (dsn.group(1), dsn.group(2)) == (
        postgres_env["POSTGRES_USER"],
        postgres_env["POSTGRES_DB"],
    )


def test_the_api_needs_an_admin_key() -> None:
    assert "TIMEWHEEL_ADMIN_KEY" in _services()["api"]["environment"]


def test_depends_on_names_services_with_healthchecks() -> None:
    services = _services()
    for name, service in services.items():
        for needed in service.get("depends_on", {}):
            assert needed in services, (name, needed)
            assert "healthcheck" in services[needed], (name, needed)
    assert set(services["archiver"]["depends_on"]) == {"redis", "postgres"}


def test_mounted_files_exist_and_the_worker_app_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    for service in _services().values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).is_file(), volume
    worker = _services()["worker"]
    mounted = {v.split(":")[1] for v in worker["volumes"]}
    spec = worker["command"][worker["command"].index("--app") + 1]
    assert f"{worker['working_dir']}/{spec.split(':')[0]}.py" in mounted
    monkeypatch.setattr(sys, "path", [str(DEPLOY), *sys.path])
    assert callable(load_handler(spec))


def test_the_runbooks_timewheel_commands_parse() -> None:
    """Every `timewheel ...` command of the recovery runbook and the README's recovery
    lines (dev, compose, restore) parses, flags included."""
    commands = []
    for page in (RUNBOOK, ROOT / "README.md"):
        for line in page.read_text(encoding="utf-8").splitlines():
            found = re.search(
                r"(?:^|\s)timewheel ((?:dev|restore|archiver|snapshot)\b[^#&;]*)", line
            )
            if found and not line.lstrip().startswith("#"):
                commands.append(found.group(1).split())
    assert ["dev", "--restore"] in commands
    assert ["restore"] in commands  # the compose line
    for argv in commands:
        assert build_parser().parse_args(argv).command == argv[0]
