"""The durability check the api and scheduler run at start passes on a safe Redis
(AOF always, noeviction), standalone and every primary of a Cluster."""

from __future__ import annotations

import pytest

from timewheel.engine import Engine
from timewheel.errors import ConfigError
from timewheel.store import deployment


async def test_a_safe_redis_passes_the_durability_check(engine: Engine) -> None:
    try:
        await deployment.check_durability(engine.client, engine.settings)
    except ConfigError as refused:
        pytest.fail(f"AOF always and noeviction (every primary) were refused: {refused}")
