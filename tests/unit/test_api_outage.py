"""A Redis outage a handler did not name itself answers 503 unavailable, not 500: the
Cluster client's RedisClusterException (no RedisError) once no node answers, or a lost
connection (api/errors.py)."""

from __future__ import annotations

import json

import pytest
from redis.exceptions import ConnectionError, RedisClusterUnreachableError, ResponseError
from starlette.requests import Request

from timewheel.api.errors import response_for


def _request() -> Request:
    return Request({"type": "http", "method": "GET", "path": "/v1/tasks", "headers": []})


@pytest.mark.parametrize(
    "exc",
    [RedisClusterUnreachableError("no node reachable"), ConnectionError("closed"), OSError(104)],
)
def test_an_outage_is_503_unavailable(exc: Exception) -> None:
    response = response_for(_request(), exc)
    assert response.status_code == 503
    assert json.loads(bytes(response.body))["error"]["code"] == "unavailable"


def test_a_script_error_stays_a_500() -> None:
    response = response_for(_request(), ResponseError("ERR user_function: boom"))
    assert response.status_code == 500
