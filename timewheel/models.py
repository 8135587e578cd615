"""Value types under the names they are imported by: `timewheel.models.Delivery` and the
rest. Each is defined with its concept (tasks/model.py, runs/delivery.py, dispatch/tick.py)."""

from timewheel.dispatch.tick import LAG_BUCKETS_MS, PromoteResult, TickResult
from timewheel.runs.delivery import Delivery
from timewheel.tasks.model import CreateResult, Task
from timewheel.types import JSONValue, ms_to_rfc3339

__all__ = [
    "LAG_BUCKETS_MS",
    "CreateResult",
    "Delivery",
    "JSONValue",
    "PromoteResult",
    "Task",
    "TickResult",
    "ms_to_rfc3339",
]
