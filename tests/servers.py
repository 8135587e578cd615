"""Session-scoped pytest fixtures that run real redis-server processes on free loopback ports.

Import them into a conftest.py (``from tests.servers import redis_cluster, redis_standalone``)
or load this module as a plugin (``pytest_plugins = ["tests.servers"]``). Both fail loudly,
never skip, when redis-server or redis-cli is missing.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from timewheel.store.server import RedisServer
from timewheel.testing.redis_cluster import RedisClusterServers


@pytest.fixture(scope="session")
def redis_standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One standalone redis-server with AOF (appendfsync always), stopped at session end."""
    server = RedisServer(tmp_path_factory.mktemp("redis-standalone"), appendfsync="always")
    with server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    """A 3-primary Redis Cluster without replicas, started on first use (about 2 s)."""
    cluster = RedisClusterServers(tmp_path_factory.mktemp("redis-cluster"), primaries=3)
    with cluster:
        yield cluster
