"""Fixtures of the process tests: a real `timewheel api` process to talk to."""

from collections.abc import Iterator

import pytest

from timewheel.store.server import RedisServer
from timewheel.testing.apiserver import ApiServer, start_api


@pytest.fixture(scope="module")
def api_server(
    redis_standalone: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ApiServer]:
    """One `timewheel api` process per test module, on the session's standalone server."""
    log = tmp_path_factory.mktemp("api") / "api.log"
    proc, server = start_api(redis_standalone.url, log)
    try:
        yield server
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert "Traceback" not in log.read_text(), log.read_text()
