"""The executor library, where users import it from: `from timewheel.worker import Worker`.

The worker lives in timewheel/runs/worker.py; this module keeps the import path.
"""

from timewheel.runs.signals import PermanentError, Retry
from timewheel.runs.worker import DEFAULT_GROUP, Handler, Worker, run_worker

__all__ = ["DEFAULT_GROUP", "Handler", "PermanentError", "Retry", "Worker", "run_worker"]
