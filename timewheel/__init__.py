"""timewheel: multi-tenant, durable, distributed task scheduling on Redis."""

from timewheel.config import Settings
from timewheel.dispatch.tick import TickResult
from timewheel.engine import Engine, NewTask
from timewheel.errors import (
    ConfigError,
    InvalidState,
    LeaseLost,
    PayloadTooLarge,
    PermanentError,
    RedisUnavailable,
    ScriptError,
    TaskNotFound,
    TimewheelError,
    ValidationError,
)
from timewheel.runs.delivery import Delivery
from timewheel.runs.signals import Retry
from timewheel.runs.worker import Worker, run_worker
from timewheel.tasks.model import CreateResult, Task

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "CreateResult",
    "Delivery",
    "Engine",
    "InvalidState",
    "LeaseLost",
    "NewTask",
    "PayloadTooLarge",
    "PermanentError",
    "RedisUnavailable",
    "Retry",
    "ScriptError",
    "Settings",
    "Task",
    "TaskNotFound",
    "TickResult",
    "TimewheelError",
    "ValidationError",
    "Worker",
    "__version__",
    "run_worker",
]
