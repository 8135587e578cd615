"""A listing cursor the API did not give out is a 422 naming `cursor`, never an outage."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from timewheel.api import create_app
from timewheel.engine import Engine
from timewheel.testing.api import assert_error, tenant_headers


@pytest.fixture
async def client(standalone_engine: Engine) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(standalone_engine.settings, engine=standalone_engine)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    headers = await tenant_headers(standalone_engine, "acme")
    async with httpx.AsyncClient(transport=transport, base_url="http://tw", headers=headers) as c:
        yield c


@pytest.mark.parametrize(
    ("path", "cursor"),
    [
        ("/v1/tasks", "0.0.99999999999999999999."),  # past the largest HSCAN cursor
        ("/v1/tasks", "0.0.18446744073709551616."),
        ("/v1/schedules", "0.88858037782011580386.zjcgaw6v13mrp6i0o980"),  # SSCAN's
        ("/v1/schedules", "0.18446744073709551616."),
    ],
)
async def test_a_cursor_past_what_redis_scans_is_422(
    client: httpx.AsyncClient, path: str, cursor: str
) -> None:
    resp = await client.get(path, params={"cursor": cursor})
    assert_error(resp, 422, "invalid", "cursor")
    assert "SCAN" not in resp.text.upper()


async def test_the_largest_scan_cursor_is_still_taken(client: httpx.AsyncClient) -> None:
    for path, cursor in (
        ("/v1/tasks", "0.0.18446744073709551615."),
        ("/v1/schedules", "0.18446744073709551615."),
    ):
        resp = await client.get(path, params={"cursor": cursor})
        assert resp.status_code != 422, resp.text
        assert resp.status_code < 500, resp.text
