"""The redis-server settings timewheel recommends and the helpers that find binaries and
ports: read from files and sockets, no server started."""

from __future__ import annotations

import shlex
import socket
from pathlib import Path

import pytest

from timewheel.errors import ConfigError
from timewheel.store import server as redis_server
from timewheel.store.server import RECOMMENDED_CONFIG, find_free_port
from timewheel.testing import redis_cluster as cluster_servers

DEPLOY_REDIS_CONF = Path(__file__).resolve().parents[2] / "deploy" / "redis.conf"


def test_missing_binary_raises_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda name: None)
    monkeypatch.setattr("os.access", lambda path, mode: False)
    with pytest.raises(ConfigError, match="redis-server not found on PATH"):
        redis_server.redis_server_binary()
    with pytest.raises(ConfigError, match="redis-cli not found on PATH"):
        cluster_servers.redis_cli_binary()


def _parse_redis_conf(path: Path) -> dict[str, str]:
    settings: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, *args = shlex.split(line)
        settings[name.lower()] = " ".join(args)
    return settings


def test_deploy_redis_conf_holds_recommended_config() -> None:
    settings = _parse_redis_conf(DEPLOY_REDIS_CONF)
    for name, value in RECOMMENDED_CONFIG.items():
        assert settings.get(name) == value, name
    assert settings["appendonly"] == "yes"
    # Usable as is on any machine: the working directory, loopback, protected mode.
    assert settings["dir"] == "./"
    assert settings["bind"] == "127.0.0.1 -::1" and settings["protected-mode"] == "yes"


def test_find_free_port_leaves_cluster_bus_port_free() -> None:
    for _ in range(20):
        port = find_free_port(cluster_bus=True)
        assert 0 < port <= 65535 - 10000
        for candidate in (port, port + 10000):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind(("127.0.0.1", candidate))
