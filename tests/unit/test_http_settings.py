"""The HTTP server's limits as settings: read from TIMEWHEEL_HTTP_* and checked."""

from __future__ import annotations

import pytest

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
