"""The HTTP server's limits as settings: read from TIMEWHEEL_HTTP_*, checked, and taken as
options by `timewheel api` and `timewheel dev` (an option wins over the environment)."""

from __future__ import annotations

import pytest

from timewheel.cli import build_parser
from timewheel.cli.parser import HTTP_LIMITS, http_options
from timewheel.config import Settings
from timewheel.errors import ConfigError


def test_the_limits_come_from_the_environment_and_are_checked() -> None:
    settings = Settings.from_env(
        {"TIMEWHEEL_HTTP_MAX_CONNECTIONS": "7", "TIMEWHEEL_HTTP_HEADER_TIMEOUT_S": "3"}
    )
    assert (settings.http_max_connections, settings.http_header_timeout_s) == (7, 3)
    for name, value in [
        ("http_header_timeout_s", 0),
        ("http_keepalive_s", 0),
        ("http_body_timeout_s", 0),
        ("http_max_header_bytes", 1023),
        ("http_max_connections", 0),
        ("http_max_body_bytes", 0),
    ]:
        with pytest.raises(ConfigError, match=f"'{name}' has value {value}"):
            Settings(**{name: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("command", ["api", "dev"])
def test_api_and_dev_take_the_limits_as_options(command: str) -> None:
    assert {name for name, _ in HTTP_LIMITS} == {
        name for name in Settings.__dataclass_fields__ if name.startswith("http_")
    }
    env = {"TIMEWHEEL_HTTP_MAX_HEADER_BYTES": "4096", "TIMEWHEEL_HTTP_KEEPALIVE_S": "9"}
    args = build_parser().parse_args([command, "--http-max-header-bytes", "8192"])
    settings = Settings.from_env(env, **http_options(args))
    assert (settings.http_max_header_bytes, settings.http_keepalive_s) == (8192, 9)
    too_small = build_parser().parse_args([command, "--http-max-header-bytes", "10"])
    with pytest.raises(ConfigError, match="http_max_header_bytes"):
        Settings.from_env({}, **http_options(too_small))
