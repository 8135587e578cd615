"""Schedules through the HTTP API on a real redis-server, with a real scheduler running."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import httpx
import pytest

from timewheel.api import create_app
from timewheel.engine import Engine
from timewheel.testing.api import assert_error, tenant_headers
from timewheel.testing.dispatch import all_deliveries, running_scheduler
from timewheel.testing.settings import test_settings


@pytest.fixture
async def engine(standalone_url: str) -> AsyncIterator[Engine]:
    eng = await Engine.connect(test_settings(standalone_url, plan_horizon_ms=4_000))
    try:
        yield eng
    finally:
        await eng.close()


@pytest.fixture
async def client(engine: Engine) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(engine.settings, engine=engine)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    headers = await tenant_headers(engine, "default")
    async with httpx.AsyncClient(transport=transport, base_url="http://tw", headers=headers) as c:
        c.other_headers = await tenant_headers(engine, "other")  # type: ignore[attr-defined]
        yield c


def _ms(rfc3339: str) -> int:
    return round(datetime.fromisoformat(rfc3339).timestamp() * 1000)


def _rfc(dt: datetime) -> str:
    return dt.isoformat().replace("+00:00", "Z")


async def test_every_second_for_ten_seconds(engine: Engine, client: httpx.AsyncClient) -> None:
    async with running_scheduler(engine):
        resp = await client.post("/v1/schedules", json={"every_s": 1, "payload": {"k": 1}})
        assert resp.status_code == 201, resp.text
        sid = resp.json()["id"]
        start = time.time()
        await asyncio.sleep(10.2)
        stop = await client.post(f"/v1/schedules/{sid}/pause")
        assert stop.json()["state"] == "paused"
    fires = [d for d in await all_deliveries(engine) if d.schedule_id == sid]
    assert 9 <= len(fires) <= 11
    for d in fires:
        assert d.run_id == f"{sid}@{d.due_ms}"
        assert start * 1000 < d.due_ms
        assert 0 <= d.dispatched_ms - d.due_ms < 1000, d
        assert d.payload == {"k": 1}
    dues = [d.due_ms for d in fires]
    assert dues == sorted(set(dues)) and {b - a for a, b in pairwise(dues)} == {1000}
    runs = (await client.get(f"/v1/schedules/{sid}/runs")).json()["runs"]
    assert [r["run_id"] for r in runs] == [d.run_id for d in fires]
    assert {r["state"] for r in runs} == {"dispatched"}


async def test_schedule_endpoints(client: httpx.AsyncClient) -> None:
    body = {
        "cron": "0 9 * * 1-5",
        "timezone": "Europe/Paris",
        "queue": "reports",
        "payload": {"report": "daily"},
        "catchup": "latest",
        "catchup_window_s": 600,
        "overlap": "skip",
        "retry": {"max_attempts": 3},
    }
    created = await client.post("/v1/schedules", json=body, headers={"Idempotency-Key": "d1"})
    assert created.status_code == 201, created.text
    s = created.json()
    sid = s["id"]
    assert (s["cron"], s["timezone"], s["state"], s["overlap"]) == (
        "0 9 * * 1-5",
        "Europe/Paris",
        "active",
        "skip",
    )
    assert s["retry"] == {"max_attempts": 3}
    assert datetime.fromisoformat(s["next_run_at"]).astimezone(UTC).hour in (7, 8)
    again = await client.post("/v1/schedules", json=body, headers={"Idempotency-Key": "d1"})
    assert again.status_code == 200 and again.json()["id"] == sid
    assert (await client.get(f"/v1/schedules/{sid}")).json()["queue"] == "reports"

    patched = await client.patch(f"/v1/schedules/{sid}", json={"every_s": 3600, "payload": 2})
    assert patched.status_code == 200, patched.text
    assert patched.json()["every_s"] == 3600 and "cron" not in patched.json()
    assert patched.json()["payload"] == 2 and patched.json()["retry"] == {"max_attempts": 3}

    assert (await client.post(f"/v1/schedules/{sid}/pause")).json()["state"] == "paused"
    assert (await client.post(f"/v1/schedules/{sid}/resume")).json()["state"] == "active"
    trig = await client.post(f"/v1/schedules/{sid}/trigger")
    assert trig.status_code == 201 and trig.json()["run_id"].startswith(f"{sid}@manual-")
    now = datetime.now(UTC)
    back = await client.post(
        f"/v1/schedules/{sid}/backfill",
        json={"from": _rfc(now - timedelta(hours=3)), "to": _rfc(now)},
    )
    assert back.status_code == 200 and back.json()["added"] == 3
    task = await client.get(f"/v1/tasks/{trig.json()['run_id']}")
    assert task.status_code == 200 and task.json()["schedule_id"] == sid
    deleted = await client.delete(f"/v1/schedules/{sid}")
    assert deleted.status_code == 200 and deleted.json()["deleted"] is True
    assert_error(await client.get(f"/v1/schedules/{sid}"), 404, "not_found")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "0 * * * *", "timezone": "Mars/Olympus"}, "timezone"),
        (
            {"every_s": 60, "start_at": "2027-01-02T00:00:00Z", "end_at": "2027-01-01T00:00:00Z"},
            "end_at",
        ),
        ({"every_s": 0.5}, "every_s"),
        ({"cron": "0 * * * *", "every_s": 60}, "every_s"),
        ({"payload": 1}, "cron"),
        ({"every_s": 60, "catchup": "some"}, "catchup"),
        ({"every_s": 60, "overlap": "queue"}, "overlap"),
        ({"every_s": 60, "max_runs": 0}, "max_runs"),
        ({"every_s": 60, "start_at": "tomorrow"}, "start_at"),
        ({"every_s": 60, "colour": "red"}, "colour"),
        ({"every_s": 60, "jitter_s": -1}, "jitter_s"),
        ({"every_s": 60, "jitter_s": 86_401}, "jitter_s"),
        ({"cron": "0 * * * *\u0000"}, "cron"),
        ({"cron": "0 * * * *", "timezone": "UTC\n"}, "timezone"),
        ({"every_s": 60, "queue": "q\u007f"}, "queue"),
        ({"every_s": 60, "idempotency_key": "a\u0001b"}, "idempotency_key"),
        ({"every_s": 60, "start_at": "2027-01-01T00:00:00Z\u0000"}, "start_at"),
        ({"every_s": 10**400}, "every_s"),
        ({"every_s": 60, "catchup_window_s": -(10**400)}, "catchup_window_s"),
        ({"every_s": 60, "max_runs": 10**400}, "max_runs"),
        ({"every_s": 60, "retry": {"max_s": 10**400}}, "retry.max_s"),
        ({"every_s": 60, "paused": "yes"}, "paused"),
    ],
)
async def test_invalid_schedules_get_422_naming_the_field(
    client: httpx.AsyncClient, body: dict[str, object], field: str
) -> None:
    assert_error(await client.post("/v1/schedules", json=body), 422, "invalid", field)
    assert (await client.get("/v1/schedules")).json()["items"] == []


@pytest.mark.parametrize(
    "body",
    [
        b'{"every_s": NaN}',
        b'{"every_s": 60, "payload": [Infinity]}',
        b'{"every_s": 60, "jitter_s": -Infinity}',
        b'{"colour": "red", "every_s": NaN}',
    ],
)
async def test_schedule_bodies_that_are_not_json_are_400(
    client: httpx.AsyncClient, body: bytes
) -> None:
    assert_error(await client.post("/v1/schedules", content=body), 400, "malformed_json")
    sid = (await client.post("/v1/schedules", json={"every_s": 60})).json()["id"]
    before = (await client.get(f"/v1/schedules/{sid}")).json()
    assert_error(await client.patch(f"/v1/schedules/{sid}", content=body), 400, "malformed_json")
    resp = await client.post(
        f"/v1/schedules/{sid}/backfill",
        content=b'{"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T01:00:00Z", "x": NaN}',
    )
    assert_error(resp, 400, "malformed_json")
    assert (await client.get(f"/v1/schedules/{sid}")).json() == before
    assert len((await client.get("/v1/schedules")).json()["items"]) == 1


async def test_a_patch_that_pauses_and_fails_changes_nothing(client: httpx.AsyncClient) -> None:
    """The PATCH pauses, then changes: a change that cannot work answers before the pause."""
    sid = (await client.post("/v1/schedules", json={"every_s": 60})).json()["id"]
    before = (await client.get(f"/v1/schedules/{sid}")).json()
    for body, status, field in [
        ({"paused": True, "cron": "61 * * * *"}, 422, "cron"),
        ({"paused": True, "timezone": "Mars/Olympus"}, 422, "timezone"),
        (
            {"paused": True, "start_at": "2027-01-02T00:00:00Z", "end_at": "2027-01-01T00:00:00Z"},
            422,
            "end_at",
        ),
        ({"paused": True, "payload": "x" * 70_000}, 413, "payload"),
    ]:
        resp = await client.patch(f"/v1/schedules/{sid}", json=body)
        assert_error(resp, status, "payload_too_large" if status == 413 else "invalid", field)
    after = (await client.get(f"/v1/schedules/{sid}")).json()
    assert after["state"] == "active" and after == before


async def test_jitter_delays_each_run_by_the_schedules_own_offset(
    client: httpx.AsyncClient,
) -> None:
    made = (await client.post("/v1/schedules", json={"cron": "0 0 * * *", "jitter_s": 600})).json()
    assert made["jitter_s"] == 600 and 0 <= made["jitter_offset_ms"] <= 600_000
    midnight = _ms(made["next_run_at"]) - made["jitter_offset_ms"]
    assert midnight % 86_400_000 == 0  # the fire time is midnight UTC; the run is due after
    patched = (await client.patch(f"/v1/schedules/{made['id']}", json={"jitter_s": 0})).json()
    assert _ms(patched["next_run_at"]) == midnight and "jitter_offset_ms" not in patched


async def test_list_pages_through_the_tenants_schedules_only(client: httpx.AsyncClient) -> None:
    made = set()
    for n in range(5):
        resp = await client.post("/v1/schedules", json={"every_s": 60 + n})
        made.add(resp.json()["id"])
    other = client.other_headers  # type: ignore[attr-defined]
    await client.post("/v1/schedules", json={"every_s": 60}, headers=other)
    seen: list[str] = []
    cursor = None
    for _ in range(20):
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = (await client.get("/v1/schedules", params=params)).json()
        assert len(page["items"]) <= 2
        seen.extend(item["id"] for item in page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(made)
    theirs = (await client.get("/v1/schedules", headers=other)).json()
    assert len(theirs["items"]) == 1 and theirs["items"][0]["id"] not in made
    assert_error(await client.get("/v1/schedules?cursor=zz"), 422, "invalid", "cursor")
    assert_error(await client.get("/v1/schedules?limit=0"), 422, "invalid", "limit")


async def test_unknown_and_foreign_schedules_are_404(client: httpx.AsyncClient) -> None:
    sid = (await client.post("/v1/schedules", json={"every_s": 60})).json()["id"]
    other = client.other_headers  # type: ignore[attr-defined]
    for method, path in [
        ("GET", ""),
        ("PATCH", ""),
        ("DELETE", ""),
        ("POST", "/pause"),
        ("POST", "/resume"),
        ("POST", "/trigger"),
        ("POST", "/backfill"),
        ("GET", "/runs"),
    ]:
        body: dict[str, object] | None = {"payload": 1} if method == "PATCH" else None
        if path == "/backfill":
            body = {"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z"}
        for target in (sid, "000aaaaaaaaaaaaa", "nonsense"):
            resp = await client.request(
                method, f"/v1/schedules/{target}{path}", json=body, headers=other
            )
            assert_error(resp, 404, "not_found")
    assert (await client.get(f"/v1/schedules/{sid}")).status_code == 200


async def test_bad_backfill_and_patch_bodies(client: httpx.AsyncClient) -> None:
    sid = (await client.post("/v1/schedules", json={"every_s": 60})).json()["id"]
    resp = await client.post(
        f"/v1/schedules/{sid}/backfill",
        json={"from": "2026-01-02T00:00:00Z", "to": "2026-01-01T00:00:00Z"},
    )
    assert_error(resp, 422, "invalid", "to")
    resp = await client.post(
        f"/v1/schedules/{sid}/backfill",
        json={"from": "2025-01-01T00:00:00Z", "to": "2026-01-01T00:00:00Z"},
    )
    assert_error(resp, 422, "invalid", "to")  # more fire times than one backfill takes
    assert_error(await client.patch(f"/v1/schedules/{sid}", json={}), 422, "invalid")
    assert_error(
        await client.patch(f"/v1/schedules/{sid}", content=b"{nope"), 400, "malformed_json"
    )
