"""The SDK retries connection errors for idempotent calls only, and creates always carry
an idempotency key, the same one on every retry."""

from __future__ import annotations

import httpx
import pytest

from timewheel.errors import TransportError
from timewheel.sdk.client import AsyncClient, Client


class Flaky:
    """Fails the first `failures` requests with a connection error, then answers 200."""

    def __init__(self, failures: int):
        self.failures = failures
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if len(self.requests) <= self.failures:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(
            200, json={"id": "t1", "state": "scheduled", "items": [], "next_cursor": None}
        )


def test_creates_and_reads_are_retried_with_one_idempotency_key() -> None:
    flaky = Flaky(2)
    with Client("http://tw", "k", transport=httpx.MockTransport(flaky)) as tw:
        tw.create_task(delay=5)
    keys = {r.headers["idempotency-key"] for r in flaky.requests}
    assert len(flaky.requests) == 3 and len(keys) == 1 and keys.pop().startswith("sdk-")
    flaky = Flaky(1)
    with Client("http://tw", "k", transport=httpx.MockTransport(flaky)) as tw:
        tw.get_task("t1")
    assert len(flaky.requests) == 2


def test_changes_that_are_not_idempotent_are_not_retried() -> None:
    for call in ("cancel", "update", "replay"):
        flaky = Flaky(1)
        with (
            Client("http://tw", "k", transport=httpx.MockTransport(flaky)) as tw,
            pytest.raises(TransportError),
        ):
            if call == "cancel":
                tw.cancel_task("t1")
            elif call == "update":
                tw.update_task("t1", delay=1)
            else:
                tw.replay_dead_letter("t1")
        assert len(flaky.requests) == 1


async def test_async_client_gives_up_after_its_retries() -> None:
    flaky = Flaky(10)
    transport = httpx.MockTransport(flaky)
    async with AsyncClient("http://tw", "k", retries=2, transport=transport) as tw:
        with pytest.raises(TransportError):
            await tw.list_tasks()
    assert len(flaky.requests) == 3
