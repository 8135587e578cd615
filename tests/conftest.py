"""The suite's fixtures come from the timewheel.testing plugin: real servers (standalone
redis-server with AOF, a 3-primary Cluster, PostgreSQL), settings with a fresh key prefix
per test, and engines on them. Helpers in timewheel.testing get pytest's assert messages.
"""

from collections.abc import AsyncIterator, Iterator

import pytest

pytest.register_assert_rewrite("timewheel.testing")

from timewheel.engine import Engine  # noqa: E402
from timewheel.store.server import RedisServer  # noqa: E402
from timewheel.testing.apiserver import ApiServer, start_api  # noqa: E402
from timewheel.testing.schedules import schedule_settings  # noqa: E402

pytest_plugins = ["timewheel.testing.plugin"]


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


@pytest.fixture
async def schedule_engine(redis_url: str) -> AsyncIterator[Engine]:
    """An engine on schedule_settings: a few runs planned ahead, catch-up within seconds."""
    eng = await Engine.connect(schedule_settings(redis_url))
    try:
        yield eng
    finally:
        await eng.close()
