"""pytest plugin: real servers on free loopback ports, and settings and engines on them.

Load it with ``pytest_plugins = ["timewheel.testing.plugin"]`` in the top conftest.py.
The servers are session-scoped and started on first use: a standalone redis-server with
AOF (appendfsync always), a 3-primary Redis Cluster and a PostgreSQL server; `own_redis`
is a redis-server of one test's own. A missing
binary fails the test that needs it loudly; nothing is ever skipped.

Each test gets its own key prefix (`test_settings`), so tests never see each other's
keys and nothing is flushed. The `engine` fixture (and everything built on `redis_url`)
runs every test that uses it twice: on the standalone server and on the Cluster.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from timewheel.config import Settings
from timewheel.engine import Engine
from timewheel.store.server import RedisServer
from timewheel.testing.postgres import PostgresServer
from timewheel.testing.redis_cluster import RedisClusterServers
from timewheel.testing.settings import executor_settings, test_settings


@pytest.fixture(scope="session")
def redis_standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One standalone redis-server with AOF (appendfsync always), stopped at session end."""
    server = RedisServer(tmp_path_factory.mktemp("redis-standalone"), appendfsync="always")
    with server:
        yield server


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own (appendfsync everysec), for a test that wipes it."""
    server = RedisServer(tmp_path / "redis", appendfsync="everysec")
    with server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    """A 3-primary Redis Cluster without replicas, started on first use (about 2 s)."""
    cluster = RedisClusterServers(tmp_path_factory.mktemp("redis-cluster"), primaries=3)
    with cluster:
        yield cluster


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the session (about 2 s to start)."""
    server = PostgresServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_dsn(postgres_server: PostgresServer) -> str:
    """A fresh, empty database of the session's server."""
    return postgres_server.create_database()


@pytest.fixture(params=["standalone", pytest.param("cluster", marks=pytest.mark.cluster)])
def redis_url(request: pytest.FixtureRequest) -> str:
    """The URL of the standalone server or of a Cluster node."""
    if request.param == "standalone":
        server: RedisServer = request.getfixturevalue("redis_standalone")
        return server.url
    cluster: RedisClusterServers = request.getfixturevalue("redis_cluster")
    return cluster.url


@pytest.fixture
def standalone_url(redis_standalone: RedisServer) -> str:
    """The URL of the standalone server only."""
    return redis_standalone.url


@pytest.fixture
def settings(redis_url: str) -> Settings:
    return test_settings(redis_url)


@pytest.fixture
async def engine(settings: Settings) -> AsyncIterator[Engine]:
    eng = await Engine.connect(settings)
    try:
        yield eng
    finally:
        await eng.close()


@pytest.fixture
async def standalone_engine(standalone_url: str) -> AsyncIterator[Engine]:
    eng = await Engine.connect(test_settings(standalone_url))
    try:
        yield eng
    finally:
        await eng.close()


@pytest.fixture
async def fast(standalone_url: str) -> AsyncIterator[Engine]:
    """An engine with short retry, lease and reap times, so tests take seconds."""
    engine = await Engine.connect(executor_settings(standalone_url))
    try:
        yield engine
    finally:
        await engine.close()


@pytest.fixture
async def engine_pg(standalone_url: str, postgres_dsn: str) -> AsyncIterator[tuple[Engine, str]]:
    """An engine on the standalone server archiving to a fresh database, and its DSN."""
    eng = await Engine.connect(test_settings(standalone_url, postgres_dsn=postgres_dsn))
    try:
        yield eng, postgres_dsn
    finally:
        await eng.close()
