"""The webhook executor: POST each run's payload to a URL, with the run id as Idempotency-Key.

2xx acknowledges the run. Anything else, or a timeout, fails the attempt, which the
retry policy turns into a later attempt (after the server's Retry-After, when it sent
one) or a dead letter. The target is a fixed URL, or the payload's own `url` (then the
payload's `body` is what is posted) when its host is on the allow-list.
"""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import Collection, Iterable
from urllib.parse import urlsplit

import httpx

from timewheel.errors import ConfigError, PermanentError
from timewheel.runs.delivery import Delivery
from timewheel.runs.metrics import WorkerMetrics
from timewheel.runs.signals import Retry
from timewheel.runs.worker import DEFAULT_GROUP, Worker
from timewheel.store.shard import Store

MAX_RETRY_AFTER_S = 30 * 86400.0
"""A Retry-After further out than this is taken as this (a hostile or broken server)."""


def _http_date(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return email.utils.parsedate_to_datetime(value.strip()).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def retry_after_s(
    value: str | None, date: str | None = None, now_s: float | None = None
) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds, or an HTTP date read
    against the same response's Date header (the server's clock on both sides, so this
    node's clock plays no part); without a usable Date, against `now_s` (this node's
    clock). None for a missing or malformed value."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return min(float(value), MAX_RETRY_AFTER_S)
    when = _http_date(value)
    if when is None:
        return None
    sent = _http_date(date)
    reference = sent if sent is not None else (time.time() if now_s is None else now_s)
    return min(max(0.0, when - reference), MAX_RETRY_AFTER_S)


class WebhookExecutor:
    """Delivers (tenant, queue) pairs to HTTP endpoints: `tenant` and `queue`, or `pairs`
    (or both), as a Worker takes them."""

    def __init__(
        self,
        store: Store,
        tenant: str | None = None,
        queue: str = "default",
        *,
        pairs: Iterable[tuple[str, str]] = (),
        url: str | None = None,
        allow_hosts: Collection[str] = (),
        timeout_s: float = 10.0,
        concurrency: int = 10,
        prefetch: int | None = None,
        group: str = DEFAULT_GROUP,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        if url is None and not allow_hosts:
            raise ConfigError("give --url, or --allow-host for URLs taken from payloads")
        if url is not None and urlsplit(url).scheme not in ("http", "https"):
            raise ConfigError(f"webhook URL {url!r} must be http or https")
        self.url = url
        self.allow_hosts = {h.lower() for h in allow_hosts}
        self.timeout_s = timeout_s
        self.worker = Worker(
            store,
            tenant,
            queue,
            pairs=pairs,
            group=group,
            concurrency=concurrency,
            prefetch=prefetch,
            metrics=metrics,
        )
        # As many connections as requests in flight: a pool smaller than the concurrency
        # would queue requests inside the client, not at the receiver.
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self.http = httpx.AsyncClient(timeout=timeout_s, follow_redirects=False, limits=limits)

    async def aclose(self) -> None:
        await self.http.aclose()

    def target(self, delivery: Delivery) -> tuple[str, str]:
        """(url, body JSON text) for a delivery."""
        if self.url is not None:
            return self.url, delivery.payload_json
        payload = delivery.payload
        if not isinstance(payload, dict) or not isinstance(payload.get("url"), str):
            raise PermanentError("payload has no 'url' and the executor has no fixed URL")
        url = payload["url"]
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or (parts.hostname or "") not in self.allow_hosts:
            raise PermanentError(f"URL {url!r} is not on the allow-list")
        return url, json.dumps(payload.get("body"))

    async def deliver(self, delivery: Delivery) -> None:
        """The handler: one POST; returning acks, raising fails the attempt."""
        url, body = self.target(delivery)
        headers = {
            "content-type": "application/json",
            "idempotency-key": delivery.run_id,
            "x-timewheel-attempt": str(delivery.attempt),
            "x-timewheel-task-id": delivery.task_id,
        }
        try:
            resp = await self.http.post(url, content=body.encode(), headers=headers)
        except httpx.TimeoutException:
            raise Retry(None, f"timeout after {self.timeout_s} s") from None
        except httpx.HTTPError as exc:
            raise Retry(None, f"{type(exc).__name__}: {exc}") from None
        if 200 <= resp.status_code < 300:
            return
        wait_s = retry_after_s(resp.headers.get("retry-after"), resp.headers.get("date"))
        raise Retry(wait_s, f"HTTP {resp.status_code}")
