"""deploy/redis.conf as an operator runs it: `redis-server deploy/redis.conf --dir D`
on this machine, outside any container."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import redis

from timewheel.store.server import find_free_port, redis_server_binary

CONF = Path(__file__).resolve().parents[2] / "deploy" / "redis.conf"


def test_redis_conf_starts_a_durable_loopback_server_in_the_given_dir(tmp_path: Path) -> None:
    port = find_free_port()
    proc = subprocess.Popen(
        [redis_server_binary(), str(CONF), "--dir", str(tmp_path), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    client = redis.Redis(port=port)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert proc.poll() is None, "redis-server exited: deploy/redis.conf failed"
                assert time.monotonic() < deadline, "redis-server did not answer"
                time.sleep(0.05)
        config = client.config_get("*")
        assert config["bind"] == "127.0.0.1 -::1"
        assert config["protected-mode"] == "yes"
        assert (config["appendonly"], config["appendfsync"]) == ("yes", "always")
        assert config["maxmemory-policy"] == "noeviction"
        client.set("k", "v")
        client.bgrewriteaof()
        assert (tmp_path / "appendonlydir").is_dir()
    finally:
        client.close()
        proc.terminate()
        proc.wait(timeout=10)
