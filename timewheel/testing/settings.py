"""Settings for tests and benches: a fresh key prefix and small, fast layout values."""

from __future__ import annotations

import secrets

from timewheel.config import Settings


def test_settings(redis_url: str, **overrides: object) -> Settings:
    """Settings with a fresh prefix and small, fast layout values."""
    values: dict[str, object] = {
        "redis_url": redis_url,
        "prefix": "t" + secrets.token_hex(4),
        "shards": 8,
        "bucket_ms": 2_000,
        "horizon_ms": 2_000,
        "poll_cap_ms": 100,
        # No continuous audit (and no canaries) unless a test asks for it: its runs would
        # be in the streams and records other tests count.
        "audit_interval_ms": 0,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


test_settings.__test__ = False  # type: ignore[attr-defined]


def executor_settings(redis_url: str, **overrides: object) -> Settings:
    """test_settings with short retry, lease and reap times, so executor tests take seconds."""
    values: dict[str, object] = {
        "retry_initial_ms": 100,
        "retry_jitter": "proportional",
        "visibility_timeout_ms": 1000,
        "min_visibility_timeout_ms": 100,
        "reap_interval_ms": 100,
        "poll_cap_ms": 50,
    }
    values.update(overrides)
    return test_settings(redis_url, **values)
