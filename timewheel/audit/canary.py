"""Canaries: one task per shard per `canary_interval_ms`, sent through the path every run
takes, so a shard whose runs stop going out is seen within seconds, whatever its load.

A canary is created by the create script (lua/task_create.lua) in its shard, due at once,
under the reserved tenant INTERNAL_TENANT: a name no user tenant can have ('~' is not a
name character), with no tenant record, so no key and no listing reaches it, and usage
and per-tenant metrics of users never count it. The scheduler node holding the shard
ticks it into the ready stream of queue CANARY_QUEUE; the auditing node reads that stream
with a consumer group of its own (registered as a worker registers one, so the reaper
watches it) and acknowledges it through the ordinary ack (lua/run_ack.lua).

Per shard it measures the latest canary's lag from its due time to its dispatch (the
envelope's dispatched_ms) and to its ack, and whether the newest canary whose deadline
(due + canary_deadline_ms) has passed is still unacknowledged: then the shard is missing
its canary (a finding of kind canary_missing). At most MAX_OUTSTANDING canaries per shard
wait unacknowledged; a shard past that gets no new one until one comes back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import structlog
from redis.exceptions import RedisError

from timewheel import ids
from timewheel.audit.findings import Finding, Kind
from timewheel.dispatch.metrics import INTERNAL_TENANT, AuditorMetrics
from timewheel.errors import RedisUnavailable, TimewheelError
from timewheel.runs.delivery import Delivery, parse_entry
from timewheel.runs.outcomes import Outcomes
from timewheel.store.shard import Store
from timewheel.tasks.creates import PreparedCreate, result_of
from timewheel.tasks.model import NewTask
from timewheel.tasks.ops import TaskOps
from timewheel.types import ms_to_rfc3339

CANARY_QUEUE = "canary"
CANARY_GROUP = "timewheel-canary"
MAX_OUTSTANDING = 3
"""Canaries of one shard waiting for their ack at most."""
READ_COUNT = 16
"""Entries one read of a canary stream takes at most."""

log = structlog.get_logger("timewheel.canary")


@dataclass(slots=True)
class Canary:
    run_id: str
    shard: int
    due_ms: int
    deadline_ms: int
    reported: bool = False
    """Whether its missing deadline was logged."""


def _deliveries(replies: list[Any]) -> list[Delivery]:
    """The entries of XREADGROUP replies (RESP2 lists or RESP3 maps)."""
    out: list[Delivery] = []
    for reply in replies:
        items = reply.items() if isinstance(reply, dict) else (reply or [])
        for name, entries in items:
            stream = name.decode() if isinstance(name, bytes) else str(name)
            if entries and isinstance(entries[0], list):
                entries = entries[0]  # RESP3: stream -> [entries]
            out.extend(parse_entry(stream, entry_id, fields) for entry_id, fields in entries)
    return out


class Canaries:
    """The canaries of the node holding the auditor lease."""

    def __init__(self, store: Store, node: str, metrics: AuditorMetrics):
        self.store = store
        self.node = node
        self.metrics = metrics
        self.settings = store.settings
        self.tasks = TaskOps(store)
        self.outcomes = Outcomes(store)
        self.waiting: dict[str, Canary] = {}
        """run id -> canary sent and not acknowledged yet."""
        self.newest_due: dict[int, Canary] = {}
        """shard -> the newest canary acknowledged or past its deadline: the shard misses
        its canary while that one is still waiting."""
        self._registered = False
        self.sent = 0
        self.received = 0

    def stream(self, shard: int) -> str:
        return self.store.keys.stream(shard, INTERNAL_TENANT, CANARY_QUEUE)

    async def _register(self) -> None:
        for shard in range(self.settings.shards):
            await self.outcomes.register_group(self.stream(shard), CANARY_GROUP)
        self._registered = True

    def _prepared(self, shard: int) -> PreparedCreate:
        token = ids.new_token()
        task_id = ids.make_task_id(shard, token)
        new = NewTask(tenant=INTERNAL_TENANT, queue=CANARY_QUEUE, delay_ms=0)
        group: list[str | int | bytes] = [
            task_id,
            INTERNAL_TENANT,
            CANARY_QUEUE,
            "",
            0,
            json.dumps({"canary": self.node}),
            "",
            "0",
        ]
        return PreparedCreate(new, task_id, shard, group)

    async def send(self) -> int:
        """One canary into every shard that has fewer than MAX_OUTSTANDING waiting; how
        many were created."""
        if not self._registered:
            await self._register()
        per_shard: dict[int, int] = {}
        for c in self.waiting.values():
            per_shard[c.shard] = per_shard.get(c.shard, 0) + 1
        prepared = [
            self._prepared(shard)
            for shard in range(self.settings.shards)
            if per_shard.get(shard, 0) < MAX_OUTSTANDING
        ]
        if not prepared:
            return 0
        deadline = self.settings.canary_deadline_ms
        for chunk in await self.store.run_many(self.tasks.create_calls(prepared)):
            for p, outcome in chunk:
                due = result_of(outcome).due_ms
                self.waiting[p.task_id] = Canary(p.task_id, p.shard, due, due + deadline)
        self.sent += len(prepared)
        return len(prepared)

    async def receive(self) -> int:
        """Read the canary streams of the shards with canaries waiting, ack what came;
        how many were acknowledged."""
        shards = sorted({c.shard for c in self.waiting.values()})
        if not shards or not self._registered:
            return 0
        client = self.store.client
        pipe = client.pipeline(transaction=False)
        for shard in shards:
            pipe.xreadgroup(CANARY_GROUP, self.node, {self.stream(shard): ">"}, count=READ_COUNT)
        try:
            replies: list[Any] = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"reading the canary streams failed: {exc}") from exc
        deliveries = _deliveries(replies)
        if not deliveries:
            return 0
        answers = await self.outcomes.ack_many(deliveries, CANARY_GROUP)
        now = self.store.clock.now_ms()
        for d, acked in zip(deliveries, answers, strict=True):
            canary = self.waiting.pop(d.run_id, None)
            if not acked or canary is None:
                continue  # an earlier node's canary, or a stale entry: acknowledged anyway
            self.received += 1
            newest = self.newest_due.get(canary.shard)
            if newest is None or newest.due_ms <= canary.due_ms:
                self.newest_due[canary.shard] = canary
            # Older canaries of the shard still waiting are given up: the shard is
            # healthy again (one that still comes is acknowledged like any other).
            for older in [c for c in self.waiting.values() if c.shard == canary.shard]:
                if older.due_ms <= canary.due_ms:
                    del self.waiting[older.run_id]
            label = str(canary.shard)
            lags = self.metrics.canary_lag
            lags[(label, "dispatched")] = max(0, d.dispatched_ms - d.due_ms) / 1e3
            lags[(label, "acked")] = max(0.0, now - d.due_ms) / 1e3
        return len(deliveries)

    def check(self) -> list[Finding]:
        """Update timewheel_canary_missing from the deadlines passed by now; the findings
        of the shards missing their canary."""
        now = self.store.clock.now_ms()
        for canary in [*self.waiting.values()]:
            if canary.deadline_ms > now:
                continue
            newest = self.newest_due.get(canary.shard)
            if newest is None or newest.due_ms <= canary.due_ms:
                self.newest_due[canary.shard] = canary
        findings = []
        for shard in range(self.settings.shards):
            newest = self.newest_due.get(shard)
            missing = newest is not None and newest.run_id in self.waiting
            self.metrics.canary_missing[str(shard)] = int(missing)
            if not missing or newest is None:
                continue
            if not newest.reported:
                newest.reported = True
                log.warning(
                    "canary_missing", shard=shard, run_id=newest.run_id, due_ms=newest.due_ms
                )
            findings.append(
                Finding(
                    Kind.CANARY_MISSING,
                    shard,
                    "",
                    newest.run_id,
                    f"canary due at {ms_to_rfc3339(newest.due_ms)} not acknowledged within "
                    f"{self.settings.canary_deadline_ms} ms",
                    "unknown",
                )
            )
        return findings

    async def step(self, send: bool) -> list[Finding]:
        """Send (when it is time), receive, check; the canary findings now."""
        try:
            if send:
                await self.send()
            await self.receive()
        except TimewheelError as exc:
            log.warning("canary_failed", error=str(exc), node=self.node)
        return self.check()
