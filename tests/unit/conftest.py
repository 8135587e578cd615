"""Unit tests need no server: one that asks for a server fixture fails at setup."""

import pytest

SERVERS = frozenset(
    {"redis_standalone", "redis_cluster", "own_redis", "postgres_server", "api_server"}
)


@pytest.fixture(autouse=True)
def _no_server(request: pytest.FixtureRequest) -> None:
    wanted = sorted(SERVERS & set(request.fixturenames))
    if wanted:
        pytest.fail(f"a unit test starts no server; move it out of tests/unit/ ({wanted})")
