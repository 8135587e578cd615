"""redis+sentinel:// URLs: what they name, and the ConfigError of a bad one (the CLI's
message and exit status 2 are in tests/process/test_sentinel.py)."""

from __future__ import annotations

import pytest

from timewheel.config import Settings
from timewheel.errors import ConfigError
from timewheel.store.connection import connect, sentinel_client
from timewheel.store.sentinel import (
    DEFAULT_PORT,
    BlockingSentinelPool,
    SentinelTarget,
    parse_sentinel_url,
)


def test_hosts_service_logins_and_db_are_read() -> None:
    target = parse_sentinel_url(
        "redis+sentinel://app:p%40ss@10.0.0.1:26379,sentinel-b:26380,[::1]:26381/orders"
        "?db=3&sentinel_password=s%3Dcret"
    )
    assert target == SentinelTarget(
        sentinels=(("10.0.0.1", 26379), ("sentinel-b", 26380), ("::1", 26381)),
        service="orders",
        username="app",
        password="p@ss",
        db=3,
        sentinel_password="s=cret",
    )
    assert target.describe() == (
        "redis+sentinel://10.0.0.1:26379,sentinel-b:26380,[::1]:26381/orders"
    )


def test_a_host_without_a_port_is_on_the_sentinel_port() -> None:
    target = parse_sentinel_url("redis+sentinel://a,b:1/svc/")
    assert target.sentinels == (("a", DEFAULT_PORT), ("b", 1))
    assert (target.username, target.password, target.db) == (None, None, 0)


def test_a_password_alone_logs_in_as_the_default_user() -> None:
    target = parse_sentinel_url("redis+sentinel://:secret@h:26379/svc")
    assert (target.username, target.password) == (None, "secret")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+sentinel:///svc", "names no sentinel"),
        ("redis+sentinel://user:pw@/svc", "names no sentinel"),
        ("redis+sentinel://h:26379", "names no service"),
        ("redis+sentinel://h:26379/", "names no service"),
        ("redis+sentinel://h:26379/a/b", "names no service"),
        ("redis+sentinel://h:port/svc", "bad port 'port'"),
        ("redis+sentinel://h:0/svc", "bad port '0'"),
        ("redis+sentinel://h:70000/svc", "bad port '70000'"),
        ("redis+sentinel://h:1,:2/svc", "a sentinel without a host"),
        ("redis+sentinel://::1:26379/svc", "write IPv6 as [addr]:port"),
        ("redis+sentinel://[::1/svc", "bad host"),
        ("redis+sentinel://h/svc?db=x", "db='x'"),
        ("redis+sentinel://h/svc?timeout=1", "unknown option(s) timeout"),
        ("redis+sentinel://h/svc#frag", "fragment"),
    ],
)
def test_a_bad_url_is_a_config_error_that_says_what_is_wrong(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match="Sentinel URL") as raised:
        parse_sentinel_url(url)
    assert message in str(raised.value)


def test_a_password_is_not_repeated_in_the_error() -> None:
    with pytest.raises(ConfigError) as raised:
        parse_sentinel_url("redis+sentinel://u:hunter2@h:x/svc?sentinel_password=hunter3")
    assert "hunter2" not in str(raised.value)
    assert "hunter3" not in str(raised.value)
    assert "u:***@h:x" in str(raised.value)


async def test_connect_refuses_a_bad_sentinel_url_before_any_connection() -> None:
    with pytest.raises(ConfigError, match="names no service"):
        await connect("redis+sentinel://127.0.0.1:1")


async def test_connect_names_the_sentinel_scheme_among_those_it_takes() -> None:
    with pytest.raises(ConfigError, match=r"redis\+sentinel://"):
        await connect("http://127.0.0.1:1")


async def test_the_client_waits_for_a_free_connection_on_the_sentinel_pool() -> None:
    client = sentinel_client("redis+sentinel://127.0.0.1:1/svc?db=2", max_connections=3)
    try:
        pool = client.connection_pool
        assert isinstance(pool, BlockingSentinelPool)
        assert pool.service_name == "svc"
        assert pool.max_connections == 3
        assert pool.connection_kwargs["db"] == 2
    finally:
        await client.aclose()


def test_settings_refuse_a_bad_sentinel_url() -> None:
    with pytest.raises(ConfigError, match="bad port"):
        Settings(redis_url="redis+sentinel://h:x/svc")
    assert Settings(redis_url="redis+sentinel://h/svc").redis_url == "redis+sentinel://h/svc"
