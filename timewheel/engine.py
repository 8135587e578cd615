"""The facade the API and the CLI work with: one deployment's store and its operations.

Each daemon takes only the part it needs (the scheduler a `Store`, the worker its
`Outcomes`); the facade gathers them for the HTTP handlers, the command line and tests.
"""

from __future__ import annotations

from timewheel.config import Settings
from timewheel.dispatch.tick import Dispatch
from timewheel.runs.outcomes import Outcomes
from timewheel.schedules.ops import ScheduleOps
from timewheel.schedules.planner import Planner
from timewheel.store.connection import RedisClient
from timewheel.store.keys import Keys
from timewheel.store.shard import Store
from timewheel.tasks.model import NewTask
from timewheel.tasks.ops import TaskOps

__all__ = ["Engine", "NewTask"]


class Engine:
    """Task, schedule, dispatch and outcome operations over one Store."""

    def __init__(self, store: Store):
        self.store = store
        self.tasks = TaskOps(store)
        self.schedules = ScheduleOps(store)
        self.planner = Planner(store)
        self.dispatch = Dispatch(store)
        self.outcomes = Outcomes(store)

    @classmethod
    async def connect(cls, settings: Settings) -> Engine:
        """Connect, check the deployment layout, and return an engine."""
        return cls(await Store.connect(settings))

    async def close(self) -> None:
        await self.store.close()

    @property
    def client(self) -> RedisClient:
        return self.store.client

    @property
    def settings(self) -> Settings:
        return self.store.settings

    @property
    def keys(self) -> Keys:
        return self.store.keys
