"""Shared fixtures: real Redis servers (tests/servers.py) and an engine per test.

Each test gets its own key prefix, so tests never see each other's keys and nothing is
flushed. The `engine` fixture runs every test that uses it twice: on a standalone
redis-server with AOF and on a 3-primary Redis Cluster.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import pytest

from tests.postgres import postgres_dsn, postgres_server
from tests.servers import redis_cluster, redis_standalone
from timewheel.config import Settings
from timewheel.engine import Engine

__all__ = ["postgres_dsn", "postgres_server", "redis_cluster", "redis_standalone"]


@pytest.fixture(params=["standalone", pytest.param("cluster", marks=pytest.mark.cluster)])
def redis_url(request: pytest.FixtureRequest) -> str:
    """The URL of the standalone server or of a Cluster node."""
    if request.param == "standalone":
        return str(request.getfixturevalue("redis_standalone").url)
    return str(request.getfixturevalue("redis_cluster").url)


@pytest.fixture
def standalone_url(redis_standalone: object) -> str:
    return str(redis_standalone.url)  # type: ignore[attr-defined]


def test_settings(redis_url: str, **overrides: object) -> Settings:
    """Settings with a fresh prefix and small, fast layout values."""
    values: dict[str, object] = {
        "redis_url": redis_url,
        "prefix": "t" + secrets.token_hex(4),
        "shards": 8,
        "bucket_ms": 2_000,
        "horizon_ms": 2_000,
        "poll_cap_ms": 100,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


test_settings.__test__ = False  # type: ignore[attr-defined]


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
