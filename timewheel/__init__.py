"""timewheel: multi-tenant, durable, distributed task scheduling on Redis."""

from timewheel.config import Settings
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
from timewheel.models import CreateResult, Delivery, Task, TickResult
from timewheel.runs.worker import Retry, Worker, run_worker

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
