"""A create call's parts: a validated create (PreparedCreate), the cap arguments
lua/task_create.lua takes (a tenant's share of max_pending per shard), and what its reply
says of each task (created, an existing task, or refused by the cap)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from timewheel.errors import OverLimit, ScriptError
from timewheel.store import record
from timewheel.store.library import ScriptArg
from timewheel.tasks.model import CreateResult, NewTask, Task


@dataclass(slots=True)
class PreparedCreate:
    """A validated create: its request, id, shard and the 8 values task_create.lua takes.
    Not frozen, though nothing changes one (as store/shard.py's Call: one per create)."""

    new: NewTask
    task_id: str
    shard: int
    group: list[ScriptArg]


CREATE_CHUNK = 200
"""Most tasks one task_create.lua call carries (keeps a call near a few ms)."""

Outcome = CreateResult | OverLimit
"""What a create call did with one task: the result, or the refusal of a tenant's cap."""

Created = tuple[PreparedCreate, Outcome]
"""One task of a task_create.lua call: its request and what the call did with it."""

CapOf = Callable[[str, int], int | None]
"""The cap of (tenant, shard): the most runs not finished of the tenant that shard may
hold after a create (its share of max_pending, timewheel/limits.py), or None for no cap."""

CREATED, COLLISION, REFUSED = 1, 2, 3
"""task_create.lua's per-task codes besides 0 (the idempotency key's task exists)."""

RETRY_AFTER_S = 1
"""Retry-After of a create refused by its shard's cap (the Limiter's, timewheel/limits.py)."""


def refusal(held: int, cap: int, shard: int) -> OverLimit:
    """The OverLimit of a run task_create.lua refused: its shard held `cap` of its
    tenant's runs not finished, the shard's share of max_pending."""
    return OverLimit(
        f"the tenant has {held} runs not finished in shard {shard}, that shard's share "
        f"({cap}) of max_pending",
        retry_after_s=RETRY_AFTER_S,
        field="max_pending",
    )


def outcome_of(prepared: PreparedCreate, reply: list[Any]) -> Outcome:
    """One task's part of a task_create.lua reply."""
    code = int(reply[0])
    if code == CREATED:
        due_ms, wake, created_ms = int(reply[1]), bool(int(reply[2])), int(reply[3])
        task = Task.created(prepared.task_id, prepared.new, due_ms, created_ms)
        return CreateResult(task, True, wake)
    if code == REFUSED:
        return refusal(int(reply[1]), int(reply[2]), prepared.shard)
    if code == COLLISION:
        raise ScriptError(f"run id collision {prepared.task_id}")
    return CreateResult(record.decode(prepared.task_id, reply[1]), False)


def result_of(outcome: Outcome) -> CreateResult:
    """A create's result, or its refusal raised."""
    if isinstance(outcome, OverLimit):
        raise outcome
    return outcome


def cap_args(
    chunk: Sequence[PreparedCreate], shard: int, caps: CapOf | None, whole: bool
) -> list[ScriptArg]:
    """task_create.lua's cap arguments for one call: its mode, then (tenant, cap) for each
    tenant of the chunk that has a cap ('' and 0 without caps: nothing is checked)."""
    if caps is None:
        return ["", 0]
    pairs: list[ScriptArg] = []
    for tenant in dict.fromkeys(p.new.tenant for p in chunk):
        cap = caps(tenant, shard)
        if cap is not None:
            pairs += [tenant, cap]
    if not pairs:
        return ["", 0]
    return ["all" if whole else "each", len(pairs) // 2, *pairs]
