"""Local redis-server processes: timewheel.store.server (standalone, for dev and tests)
and timewheel.testing.redis_cluster (a 3-primary Cluster)."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster

from timewheel.errors import ConfigError
from timewheel.store.server import RedisServer
from timewheel.testing.redis_cluster import CLUSTER_SLOTS, RedisClusterServers


def _client(server: RedisServer) -> redis.Redis:
    return redis.Redis(host=server.host, port=server.port, decode_responses=True)


def test_standalone_runs_with_aof_always(redis_standalone: RedisServer) -> None:
    assert redis_standalone.is_running()
    assert redis_standalone.url == f"redis://127.0.0.1:{redis_standalone.port}"
    client = _client(redis_standalone)
    try:
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": "always"}
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        assert client.config_get("save") == {"save": ""}
    finally:
        client.close()


def test_acknowledged_writes_survive_kill_and_restart(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis")
    try:
        server.start()
        port = server.port
        client = _client(server)
        try:
            client.hset("{tw:0}:task:1", mapping={"state": "scheduled", "run_at_ms": "1000"})
            client.zadd("{tw:0}:near", {"1": 1000})
        finally:
            client.close()

        server.kill()
        assert not server.is_running()
        server.start()

        assert server.port == port
        client = _client(server)
        try:
            assert client.hgetall("{tw:0}:task:1") == {"state": "scheduled", "run_at_ms": "1000"}
            assert client.zscore("{tw:0}:near", "1") == 1000
        finally:
            client.close()
    finally:
        server.stop()
    assert (tmp_path / "redis" / "appendonlydir").is_dir()


def test_stop_is_idempotent(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis")
    server.stop()  # never started
    with server:
        assert server.is_running()
    assert not server.is_running()
    server.stop()
    server.kill()
    assert not server.is_running()


def test_start_failure_raises_config_error_with_log_tail(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis", extra_config={"no-such-directive": "1"})
    with pytest.raises(ConfigError, match="no-such-directive"):
        server.start()
    assert not server.is_running()


@pytest.mark.cluster
def test_cluster_serves_all_slots_from_three_primaries(
    redis_cluster: RedisClusterServers,
) -> None:
    assert len(redis_cluster.servers) == 3
    assert redis_cluster.url == redis_cluster.servers[0].url
    for server in redis_cluster.servers:
        client = _client(server)
        try:
            assert client.cluster("INFO")["cluster_state"] == "ok"
            nodes = client.cluster("NODES")
            primaries = [n for n in nodes.values() if "master" in n["flags"]]
            assert len(primaries) == 3
            covered: set[int] = set()
            for start, end, *_ in client.cluster("SLOTS"):
                covered.update(range(start, end + 1))
            assert len(covered) == CLUSTER_SLOTS
        finally:
            client.close()


@pytest.mark.cluster
def test_cluster_client_writes_and_reads(redis_cluster: RedisClusterServers) -> None:
    # Not RedisCluster.from_url: in redis-py 8.1 its close() leaves the per-node pools
    # it built open (their Redis clients do not own the pool), an intermittent
    # ResourceWarning that filterwarnings=error turns into a failure.
    first = redis_cluster.servers[0]
    client = RedisCluster(host=first.host, port=first.port, decode_responses=True)
    try:
        keys = [f"{{tw:{shard}}}:probe" for shard in range(16)]
        for key in keys:
            client.set(key, key)
        assert [client.get(key) for key in keys] == keys
        for server in redis_cluster.servers:  # 16 hash tags reach every primary
            node = _client(server)
            try:
                assert node.dbsize() > 0
            finally:
                node.close()
        for key in keys:
            client.delete(key)
    finally:
        client.close()
