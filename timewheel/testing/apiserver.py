"""A real `timewheel api` process (uvicorn) on a free port, with its own key prefix and
a bootstrap admin key."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from timewheel.config import Settings
from timewheel.store.server import find_free_port
from timewheel.testing.settings import test_settings


@dataclass(frozen=True)
class ApiServer:
    url: str
    admin_key: str
    settings: Settings
    """The settings the process runs with (prefix, shards ...), for a test-side Engine."""


def start_api(
    redis_url: str, log: Path, env: Mapping[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], ApiServer]:
    """Start `timewheel api` on `redis_url`, logging to `log`, and wait for /healthz.

    `env` adds environment variables: TIMEWHEEL_* ones (the HTTP server's limits, say),
    which `settings` then holds, or others (a skewed clock, timewheel/testing/skew.py).
    """
    extra = dict(env or {})
    # As test_settings: no continuous audit (nor canaries, whose runs would sit in the
    # streams a test counts) unless the test asks for it.
    extra.setdefault("TIMEWHEEL_AUDIT_INTERVAL_MS", "0")
    base = test_settings(redis_url)
    settings = Settings.from_env(
        extra,
        redis_url=redis_url,
        prefix=base.prefix,
        shards=base.shards,
        bucket_ms=base.bucket_ms,
        horizon_ms=base.horizon_ms,
    )
    admin_key = "tw_admin_" + secrets.token_hex(16)
    port = find_free_port()
    process_env = {
        **os.environ,
        "TIMEWHEEL_PREFIX": settings.prefix,
        "TIMEWHEEL_SHARDS": str(settings.shards),
        "TIMEWHEEL_BUCKET_MS": str(settings.bucket_ms),
        "TIMEWHEEL_HORIZON_MS": str(settings.horizon_ms),
        "TIMEWHEEL_ADMIN_KEY": admin_key,
        **extra,
    }
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "timewheel.cli",
                "api",
                "--redis-url",
                redis_url,
                "--port",
                str(port),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=process_env,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            if httpx.get(f"{url}/healthz").status_code == 200:
                break
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"api did not start:\n{log.read_text()}")
        time.sleep(0.05)
    return proc, ApiServer(url, admin_key, settings)
