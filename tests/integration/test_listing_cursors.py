"""A listing's query string: a cursor the API did not give out, or a page size that is not
ASCII digits, is a 422 naming the parameter, never an outage."""

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


LISTINGS = ("/v1/tasks", "/v1/schedules", "/v1/dead-letters")


@pytest.mark.parametrize("path", LISTINGS)
@pytest.mark.parametrize(
    "limit",
    [
        "\u00b2",  # superscript two: str.isdigit() says yes, int() says no
        "\uff15",  # full-width 5
        "\u0665",  # Arabic-Indic 5
        "1\u00b2",
        "1e2",
        "+5",
        " 5",
        "5\n",
        "0",
        "1001",
        "9" * 40,
        "-1",
    ],
)
async def test_a_page_size_is_ascii_digits_in_range(
    client: httpx.AsyncClient, path: str, limit: str
) -> None:
    assert_error(await client.get(path, params={"limit": limit}), 422, "invalid", "limit")


@pytest.mark.parametrize("path", LISTINGS)
async def test_superscript_digits_in_the_raw_query_are_422(
    client: httpx.AsyncClient, path: str
) -> None:
    assert_error(await client.get(f"{path}?limit=%C2%B2"), 422, "invalid", "limit")
    assert_error(await client.get(f"{path}?limit=%EF%BC%91"), 422, "invalid", "limit")
    assert (await client.get(f"{path}?limit=7")).status_code == 200


@pytest.mark.parametrize(
    ("path", "params", "field"),
    [
        ("/v1/tasks", {"cursor": "0.0.0.\n"}, "cursor"),
        ("/v1/tasks", {"cursor": "0.0.0.\u0000"}, "cursor"),
        ("/v1/tasks", {"cursor": "\u0660.0.0."}, "cursor"),
        ("/v1/tasks", {"queue": "q\u0000"}, "queue"),
        ("/v1/tasks", {"queue": "q\n"}, "queue"),
        ("/v1/tasks", {"state": "scheduled\n"}, "state"),
        ("/v1/schedules", {"cursor": "0.0.\n"}, "cursor"),
        ("/v1/dead-letters", {"cursor": "0-0-0\n"}, "cursor"),
        ("/v1/dead-letters", {"cursor": "\uff10-0-0"}, "cursor"),
    ],
)
async def test_control_characters_and_other_digits_in_a_query_are_422(
    client: httpx.AsyncClient, path: str, params: dict[str, str], field: str
) -> None:
    assert_error(await client.get(path, params=params), 422, "invalid", field)
