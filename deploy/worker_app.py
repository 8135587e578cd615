"""The example worker of deploy/docker-compose.yml: `timewheel worker --app worker_app:handle`.

It logs each run it gets and acknowledges it by returning. Replace it with your own
module (mounted or built into your image); a handler takes a `Delivery` and returns
(acknowledged), raises `timewheel.worker.Retry` (again after a delay), raises
`timewheel.errors.PermanentError` (dead-lettered at once), or raises anything else
(retried with backoff).
"""

from __future__ import annotations

import structlog

from timewheel.models import Delivery

log = structlog.get_logger("worker_app")


async def handle(delivery: Delivery) -> None:
    """Log the run. Use `delivery.run_id` as the idempotency key of real work: a run can
    be delivered twice."""
    log.info(
        "run_handled",
        run_id=delivery.run_id,
        attempt=delivery.attempt,
        tenant=delivery.tenant,
        queue=delivery.queue,
        payload=delivery.payload,
    )
