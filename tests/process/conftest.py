"""Fixtures of the process tests: a real `timewheel api` process to talk to, the keys
the fuzz tests call it with, and a local webhook receiver."""

import secrets
from collections.abc import Iterator

import pytest

from timewheel.sdk.client import Client
from timewheel.store.server import RedisServer
from timewheel.testing.apiserver import ApiServer, start_api
from timewheel.testing.webhooks import webhook_receiver


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


@pytest.fixture(scope="module")
def fuzz_keys(api_server: ApiServer) -> dict[str, str]:
    """An admin key and a key of a fresh tenant with a few tasks; `tenant` is its id."""
    tenant = f"fuzz-{secrets.token_hex(3)}"
    with Client(api_server.url, api_server.admin_key) as admin:
        admin.create_tenant(tenant, max_pending=1000)
        key = admin.create_key(tenant)["key"]
    with Client(api_server.url, key) as tw:
        for _ in range(3):
            tw.create_task(delay=600, payload={"n": 1})
    return {"admin": api_server.admin_key, "tenant": key, "id": tenant}


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[str]]]:
    """A local HTTP receiver for webhook executors: (its URL, the run ids posted to it)."""
    with webhook_receiver() as target:
        yield target
