"""Settings: one frozen object, read from TIMEWHEEL_* environment variables or built in code."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from timewheel.errors import ConfigError
from timewheel.ids import MAX_SHARDS


@dataclass(frozen=True, slots=True)
class Settings:
    """Deployment settings. Layout fields (shards, bucket_ms) are fixed once data exists."""

    redis_url: str = "redis://127.0.0.1:6379"
    prefix: str = "tw"
    """Key prefix; every key carries the hash tag {prefix:shard}."""
    shards: int = 64
    """Logical shards, a power of two, fixed when the deployment is created."""
    bucket_ms: int = 60_000
    """Width of a far-level time bucket and of a finished-record expiry bucket."""
    horizon_ms: int = 60_000
    """How far ahead of the shard clock the promoter moves buckets into the near level."""
    tick_batch: int = 1000
    """Most runs one tick call dispatches (bounds how long one call blocks Redis)."""
    promote_batch: int = 2000
    """Most runs one promote call moves."""
    event_log_max: int = 10_000
    """Approximate cap of each shard's event log stream."""
    retention_ms: int = 86_400_000
    """How long finished task records stay readable (and dedupe idempotent creates)."""
    max_payload_bytes: int = 65_536
    """Largest accepted payload, as encoded JSON text."""
    default_spread: int = 1
    """How many shards a tenant's tasks use unless the tenant says otherwise."""
    poll_cap_ms: int = 250
    """Longest a scheduler sleeps without looking (wake-ups normally come sooner)."""
    default_queue: str = "default"

    def __post_init__(self) -> None:
        if self.shards < 1 or self.shards > MAX_SHARDS or self.shards & (self.shards - 1):
            raise ConfigError(
                f"Setting 'shards' has value {self.shards}. Not a power of two in 1..{MAX_SHARDS}."
            )
        for name in (
            "bucket_ms",
            "horizon_ms",
            "tick_batch",
            "promote_batch",
            "event_log_max",
            "max_payload_bytes",
            "default_spread",
            "poll_cap_ms",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(
                    f"Setting {name!r} has value {getattr(self, name)}. Must be >= 1."
                )
        if self.tick_batch > 5000 or self.promote_batch > 5000:
            raise ConfigError("Settings 'tick_batch' and 'promote_batch' must be <= 5000.")
        if not self.prefix or any(c in self.prefix for c in "{}: "):
            raise ConfigError(
                f"Setting 'prefix' has value {self.prefix!r}. No braces, colons, spaces."
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Settings from TIMEWHEEL_<FIELD> variables (e.g. TIMEWHEEL_REDIS_URL), then overrides."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(f"TIMEWHEEL_{f.name.upper()}")
            if raw is None:
                continue
            if f.type == "int":
                try:
                    values[f.name] = int(raw)
                except ValueError:
                    raise ConfigError(
                        f"Config 'TIMEWHEEL_{f.name.upper()}' has value {raw!r}. Not a valid int."
                    ) from None
            else:
                values[f.name] = raw
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def with_(self, **changes: Any) -> Settings:
        return replace(self, **changes)
