"""Which errors count as a lost connection: redis-py's own AttributeError or TypeError
on a connection a dead server closed, and uvloop's RuntimeError on a closed transport
under redis-py's code; never one raised by the caller's code."""

from __future__ import annotations

import pytest

from timewheel.store.connection import torn_connection


def _raised_in(path: str, error: str) -> BaseException:
    try:
        exec(compile(f"raise {error}", path, "exec"))
    except (AttributeError, TypeError) as exc:
        return exc
    raise AssertionError("nothing raised")


CLOSED = "unable to perform operation on <TCPTransport closed=True>; the handler is closed"
"""What uvloop raises on a write to a transport that a connection reset closed."""


def _raised_under(outer: str, inner: str, error: str) -> BaseException:
    """`error` raised by code compiled as `inner`, called from code compiled as `outer`
    (uvloop's .pyx under redis-py's connection code, say)."""
    namespace: dict[str, object] = {}
    exec(compile(f"def fail():\n    raise {error}", inner, "exec"), namespace)
    exec(compile("def call(fail):\n    fail()", outer, "exec"), namespace)
    try:
        namespace["call"](namespace["fail"])  # type: ignore[operator]
    except RuntimeError as exc:
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


REDIS_PY = "/venv/lib/python3.11/site-packages/redis/asyncio/connection.py"


def test_uvloops_closed_transport_under_redis_py_is_a_lost_connection() -> None:
    exc = _raised_under(REDIS_PY, "uvloop/handles/handle.pyx", f"RuntimeError({CLOSED!r})")
    assert torn_connection(exc)


@pytest.mark.parametrize(
    ("outer", "error"),
    [
        ("/work/timewheel/store/shard.py", f"RuntimeError({CLOSED!r})"),  # not under redis-py
        (REDIS_PY, "RuntimeError('Event loop is closed')"),  # another RuntimeError
    ],
)
def test_other_runtime_errors_are_not_a_lost_connection(outer: str, error: str) -> None:
    assert not torn_connection(_raised_under(outer, "/work/timewheel/worker.py", error))
