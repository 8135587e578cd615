"""The Lua Function library on a real server: it loads as one library of every operation,
and a server that lost it gets it back on the first call."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from timewheel.engine import Engine
from timewheel.store.library import (
    OPERATIONS,
    Library,
    function_name,
)
from timewheel.tasks.model import NewTask
from timewheel.testing.settings import test_settings


async def test_the_library_loads_and_each_operation_is_one_of_its_functions(
    standalone_url: str,
) -> None:
    library = Library.build()
    client = aioredis.Redis.from_url(standalone_url)
    try:
        await library.load(client)
        await library.load(client)  # a second load of the same version is not an error
        listed: Any = await client.execute_command(  # type: ignore[no-untyped-call]
            "FUNCTION", "LIST", "LIBRARYNAME", library.name
        )
        [entry] = [e for e in listed if _field(e, b"library_name") == library.name.encode()]
        names = {_field(f, b"name").decode() for f in _field(entry, b"functions")}
        assert names == {function_name(library.version, op) for op in OPERATIONS}
    finally:
        await client.aclose()


async def test_a_server_without_the_library_gets_it_on_first_call(standalone_url: str) -> None:
    """After a FUNCTION FLUSH (a new or emptied server) a call loads the library and
    runs once, alone and in a pipeline."""
    engine = await Engine.connect(test_settings(standalone_url, shards=1))
    try:
        await engine.client.execute_command("FUNCTION", "FLUSH")
        [made] = await engine.tasks.create_many([NewTask(tenant="a", delay_ms=60_000)])
        assert (await engine.tasks.get("a", made.task_id)).state == "scheduled"
        await engine.client.execute_command("FUNCTION", "FLUSH")
        await engine.tasks.cancel("a", made.task_id)
        assert (await engine.tasks.get("a", made.task_id)).state == "cancelled"
    finally:
        await engine.close()


def _field(entry: Any, name: bytes) -> Any:
    """A field of a FUNCTION LIST reply: a dict (redis-py's callback) or a flat list."""
    if isinstance(entry, dict):
        return entry.get(name, entry.get(name.decode()))
    pairs = dict(zip(entry[::2], entry[1::2], strict=True))
    return pairs[name]
