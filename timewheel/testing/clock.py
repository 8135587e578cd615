"""A fixed shard clock for tests that must not wait."""

from __future__ import annotations

NOW = 1_800_000_000_000
"""A fixed shard clock for deterministic tests: 2027-01-15T08:00:00Z, a whole second."""
