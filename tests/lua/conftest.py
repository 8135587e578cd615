"""Fixtures of the tests against a real Redis: an engine laid out for schedules."""

from collections.abc import AsyncIterator

import pytest

from timewheel.engine import Engine
from timewheel.testing.schedules import schedule_settings


@pytest.fixture
async def schedule_engine(redis_url: str) -> AsyncIterator[Engine]:
    """An engine on schedule_settings (standalone and Cluster): a few runs planned ahead,
    catch-up visible within seconds."""
    eng = await Engine.connect(schedule_settings(redis_url))
    try:
        yield eng
    finally:
        await eng.close()
