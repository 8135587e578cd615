"""A real api process whose Redis is past the storage guard: the SDK raises
StorageFullError for a create, the CLI prints one line and exits 2, and a cancel still
goes through."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from timewheel.cli.main import main
from timewheel.engine import Engine
from timewheel.errors import StorageFullError
from timewheel.sdk.client import Client
from timewheel.store.server import RedisServer
from timewheel.tasks.model import NewTask
from timewheel.testing.apiserver import ApiServer, start_api


@pytest.fixture(scope="module")
def full_api(
    redis_standalone: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ApiServer]:
    """`timewheel api` with a storage ceiling of 1 byte: every create meets the guard."""
    log = tmp_path_factory.mktemp("api-full") / "api.log"
    proc, server = start_api(redis_standalone.url, log, {"TIMEWHEEL_STORAGE_MAX_BYTES": "1"})
    try:
        yield server
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert "Traceback" not in log.read_text(), log.read_text()


async def test_sdk_and_cli_answer_storage_full_and_cancel_still_works(
    full_api: ApiServer, capsys: pytest.CaptureFixture[str]
) -> None:
    with Client(full_api.url, full_api.admin_key) as admin:
        admin.create_tenant("acme")
        key = admin.create_key("acme")["key"]
    with Client(full_api.url, key) as acme:
        with pytest.raises(StorageFullError) as full:
            acme.create_task(delay=60)
        assert (full.value.status, full.value.code) == (507, "storage_full")
        assert acme.list_tasks()["items"] == []
    code = main(["task", "create", "--delay", "60", "--url", full_api.url, "--key", key])
    _, err = capsys.readouterr()
    assert code == 2
    assert err.count("\n") == 1 and "507 storage_full" in err and "Traceback" not in err
    room = dataclasses.replace(full_api.settings, storage_max_bytes=0)
    engine = await Engine.connect(room)  # a create from a process with no ceiling
    try:
        made = await engine.tasks.create(NewTask(tenant="acme", delay_ms=60_000))
    finally:
        await engine.close()
    code = main(["task", "cancel", made.task_id, "--url", full_api.url, "--key", key, "--json"])
    out, err = capsys.readouterr()
    assert code == 0 and '"cancelled"' in out, err
