"""Which errors count as a lost connection: redis-py's own AttributeError or TypeError
on a connection a dead server closed, never one raised by the caller's code."""

from __future__ import annotations

import pytest

from timewheel.store.connection import torn_connection


def _raised_in(path: str, error: str) -> BaseException:
    try:
        exec(compile(f"raise {error}", path, "exec"))
    except (AttributeError, TypeError) as exc:
        return exc
    raise AssertionError("nothing raised")


@pytest.mark.parametrize(
    ("path", "torn"),
    [
        ("/venv/lib/python3.11/site-packages/redis/asyncio/connection.py", True),
        ("/usr/lib/python3.12/asyncio/selector_events.py", True),
        ("/work/timewheel/store/library.py", False),
    ],
)
@pytest.mark.parametrize("error", ["AttributeError('writelines')", "TypeError('None')"])
def test_only_errors_from_inside_the_client_are_a_lost_connection(
    path: str, torn: bool, error: str
) -> None:
    assert torn_connection(_raised_in(path, error)) is torn


def test_an_error_without_a_traceback_is_not_a_lost_connection() -> None:
    assert not torn_connection(AttributeError("x"))
