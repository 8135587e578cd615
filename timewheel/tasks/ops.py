"""Operations on one-shot tasks: create, get, cancel and update, each one Lua call on
the task's shard.

Where a task goes: `create` puts it in its shard's wheel, the near level or a far
bucket (lua/task_create.lua); `cancel` and `update` change it while it is still
scheduled (lua/task_cancel.lua, lua/task_update.lua). From there the scheduler moves it
on (timewheel/dispatch/tick.py). Python only reads (`get`: timewheel/tasks/reads.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from timewheel import ids
from timewheel.errors import (
    OverLimit,
    PayloadTooLarge,
    TaskNotFound,
    ValidationError,
)
from timewheel.store import record
from timewheel.store.library import ScriptArg, check
from timewheel.store.shard import Call, Store, clock_arg
from timewheel.tasks import reads, window
from timewheel.tasks.creates import (
    CREATE_CHUNK,
    CapOf,
    Created,
    Outcome,
    PreparedCreate,
    cap_args,
    outcome_of,
    result_of,
)
from timewheel.tasks.model import CreateResult, NewTask, Task


def _changed(run_id: str, action: str) -> Any:
    """The decoder of task_cancel.lua and task_update.lua: the record after the change."""

    def decode(reply: list[Any]) -> Task:
        check(reply, run_id=run_id, action=action)
        return record.decode(run_id, reply[1])

    return decode


class TaskOps:
    """The task operations of one deployment."""

    def __init__(self, store: Store):
        self.store = store

    def check_payload(self, payload_json: str) -> None:
        """Raise PayloadTooLarge if the encoded payload is over the deployment's limit."""
        size = len(payload_json.encode())
        limit = self.store.settings.max_payload_bytes
        if size > limit:
            raise PayloadTooLarge(f"payload is {size} bytes; the limit is {limit}", field="payload")

    # -- create ------------------------------------------------------------------------

    def task_id(self, new: NewTask) -> str | None:
        """The id a create with an idempotency key gives its task (None without one)."""
        if new.idempotency_key is None:
            return None
        token = ids.idempotent_token(new.tenant, new.idempotency_key)
        return ids.make_task_id(self.store.shard_for(new.tenant, token), token)

    def prepare(self, new: NewTask, token: str | None = None) -> PreparedCreate:
        """Validate a create and give it its id (from `token` if given and the create has
        no idempotency key, else a random one), shard and task_create.lua values.

        Raises:
            ValidationError: a name or time is malformed.
            PayloadTooLarge: the payload is over the configured limit.
        """
        ids.validate_name(new.tenant, "tenant")
        ids.validate_name(new.queue, "queue")
        self.check_payload(new.payload_json)
        if (new.run_at_ms is None) == (new.delay_ms is None):
            raise ValidationError("give exactly one of run_at or delay", field="run_at")
        if new.idempotency_key is not None:
            token = ids.idempotent_token(new.tenant, new.idempotency_key)
        elif token is None:
            token = ids.new_token()
        shard = self.store.shard_for(new.tenant, token)
        task_id = ids.make_task_id(shard, token)
        offset = window.offset_ms(token, window.option_ms(new.options, "window_s"))
        group: list[ScriptArg] = [
            task_id,
            new.tenant,
            new.queue,
            "" if new.run_at_ms is None else new.run_at_ms + offset,
            0 if new.delay_ms is None else new.delay_ms + offset,
            new.payload_json,
            json.dumps(dict(new.options), separators=(",", ":")) if new.options else "",
            "1" if new.idempotency_key is not None else "0",
        ]
        return PreparedCreate(new, task_id, shard, group)

    def create_calls(
        self,
        prepared: Sequence[PreparedCreate],
        now_ms: int | None = None,
        *,
        caps: CapOf | None = None,
        whole: bool = False,
    ) -> list[Call[list[Created]]]:
        """The task_create.lua calls for `prepared`: one per shard and chunk of
        CREATE_CHUNK, each decoding to (prepared, outcome) for the tasks it carries.
        With `caps`, each call refuses the runs that would pass their tenant's cap in
        its shard: each on its own, or with `whole` all of a tenant's runs in the call."""
        by_shard: dict[int, list[PreparedCreate]] = {}
        for p in prepared:
            by_shard.setdefault(p.shard, []).append(p)
        k, scripts = self.store.keys, self.store.scripts
        calls: list[Call[list[Created]]] = []
        for shard, group in by_shard.items():
            head = self.store.shared(shard, now_ms)
            for low in range(0, len(group), CREATE_CHUNK):
                chunk = group[low : low + CREATE_CHUNK]
                front = head + cap_args(chunk, shard, caps, whole)
                args = front + [v for p in chunk for v in p.group]

                def decode(reply: list[Any], chunk: list[PreparedCreate] = chunk) -> Any:
                    return [(p, outcome_of(p, r)) for p, r in zip(chunk, reply, strict=True)]

                keys = [k.meta(shard), k.events(shard)]
                calls.append(Call(scripts.task_create, keys, args, decode, len(front)))
        return calls

    async def create(
        self, new: NewTask, *, now_ms: int | None = None, caps: CapOf | None = None
    ) -> CreateResult:
        """Schedule a one-shot task; an existing idempotency key returns the existing task.

        Raises:
            ValidationError: a name or time is malformed.
            PayloadTooLarge: the payload is over the configured limit.
            StorageFull: the shard's Redis node is near its memory ceiling.
            OverLimit: with `caps`, the task's shard holds its tenant's cap.
        """
        await self.store.placements.load(new.tenant)
        prepared = self.prepare(new)
        if prepared.new.idempotency_key is not None:
            found = await self._made_elsewhere([prepared])
            if found:
                return found[0]
        shard = prepared.shard
        await self.store.guard.check([shard])
        k = self.store.keys
        head = self.store.shared(shard, now_ms) + cap_args([prepared], shard, caps, False)
        call = Call(
            self.store.scripts.task_create,
            [k.meta(shard), k.events(shard)],
            head + prepared.group,
            lambda reply: result_of(outcome_of(prepared, reply[0])),
            len(head),
        )
        return await self.store.write(call)

    async def create_many(self, batch: Sequence[NewTask]) -> list[CreateResult]:
        """Create many tasks: one task_create.lua call per shard (and chunk), all in one
        pipeline (on Cluster, one per node, sent concurrently); results in batch order.
        StorageFull if any of their shards' nodes is near its ceiling: none is written."""
        return [result_of(o) for o in await self.create_checked(batch)]

    async def create_checked(
        self, batch: Sequence[NewTask], *, caps: CapOf | None = None, whole: bool = False
    ) -> list[Outcome]:
        """create_many, with each call checking `caps` (create_calls): a refused task's
        outcome is its OverLimit, and nothing was written for it."""
        await self.store.placements.load_many(new.tenant for new in batch)
        prepared = self._spread(batch) if whole else [self.prepare(new) for new in batch]
        found = await self._made_elsewhere(prepared)
        todo = [p for i, p in enumerate(prepared) if i not in found]
        await self.store.guard.check(p.shard for p in todo)
        calls = self.create_calls(todo, caps=caps, whole=whole)
        by_request = {
            id(p): outcome for chunk in await self.store.write_many(calls) for p, outcome in chunk
        }
        outcomes = [found[i] if i in found else by_request[id(p)] for i, p in enumerate(prepared)]
        if caps is not None:
            await self._elsewhere(prepared, outcomes, caps, whole)
        return outcomes

    async def _elsewhere(
        self,
        prepared: list[PreparedCreate],
        outcomes: list[Outcome],
        caps: CapOf,
        whole: bool,
    ) -> None:
        """Send the refused creates without an idempotency key again, each to another
        shard of its tenant's placement that has not refused it yet (a new random id
        there), until one takes it or every shard has refused (in place: `outcomes`).

        A shard's cap is its share of max_pending: one holding its share refuses while
        the others may have room, and a random id does not know which."""
        full: dict[str, set[int]] = {}
        while True:
            again: list[tuple[int, PreparedCreate]] = []
            for i, outcome in enumerate(outcomes):
                p = prepared[i]
                if not isinstance(outcome, OverLimit) or p.new.idempotency_key is not None:
                    continue
                shards = self.store.placements.get(p.new.tenant).shards
                refused = full.setdefault(p.new.tenant, set())
                refused.add(p.shard)
                left = [s for s in shards if s not in refused]
                if left:
                    target = left[len(again) % len(left)]
                    again.append((i, self.prepare(p.new, self._token_for(p.new.tenant, target))))
            if not again:
                return
            await self.store.guard.check(p.shard for _, p in again)
            calls = self.create_calls([p for _, p in again], caps=caps, whole=whole)
            by_request = {
                id(p): outcome
                for chunk in await self.store.write_many(calls)
                for p, outcome in chunk
            }
            for i, p in again:
                prepared[i] = p
                outcomes[i] = by_request[id(p)]

    def _token_for(self, tenant: str, shard: int) -> str:
        """A new random token whose task goes to `shard` (one of the tenant's shards)."""
        placement = self.store.placements.get(tenant)
        while True:
            token = ids.new_token()
            if placement.shard_for(token) == shard:
                return token

    def _spread(self, batch: Sequence[NewTask]) -> list[PreparedCreate]:
        """prepare() for a batch whose tasks without an idempotency key split evenly over
        each tenant's shards (Placement.spread_tokens): with caps, a shard's share of
        max_pending is not filled before the others by the luck of random ids."""
        by_tenant: dict[str, list[int]] = {}
        for i, new in enumerate(batch):
            if new.idempotency_key is None:
                by_tenant.setdefault(new.tenant, []).append(i)
        tokens: dict[int, str] = {}
        for tenant, rows in by_tenant.items():
            placement = self.store.placements.get(tenant)
            tokens.update(zip(rows, placement.spread_tokens(len(rows), ids.new_token), strict=True))
        return [self.prepare(new, tokens.get(i)) for i, new in enumerate(batch)]

    async def _made_elsewhere(self, prepared: Sequence[PreparedCreate]) -> dict[int, CreateResult]:
        """The creates whose idempotency key already made its task in another shard the
        tenant has used (index in `prepared` -> that task, as a duplicate's answer).

        A key's task id names a shard of the tenant's placement, so a retry sent after
        the placement changed would compute another id: the shards the tenant's earlier
        placements gave the key are looked at first (one round trip, only for a tenant
        whose placement changed; store/placement.py).
        """
        looks: list[tuple[int, str, int]] = []  # (index, task id, shard)
        for i, p in enumerate(prepared):
            if p.new.idempotency_key is None:
                continue
            token = p.task_id[3:]
            for shard in self.store.placements.get(p.new.tenant).earlier_shards(token):
                looks.append((i, ids.make_task_id(shard, token), shard))
        if not looks:
            return {}
        exists = await self.store.records([(shard, task_id) for _, task_id, shard in looks])
        found: dict[int, CreateResult] = {}
        for (i, task_id, _), there in zip(looks, exists, strict=True):
            if there and i not in found:
                tenant = prepared[i].new.tenant
                try:
                    found[i] = CreateResult(await self.get(tenant, task_id), False)
                except TaskNotFound:  # gone since (expired), or another tenant's
                    continue
        return found

    # -- read, cancel, update ----------------------------------------------------------

    async def get(self, tenant: str, task_id: str) -> Task:
        """The task as stored (timewheel/tasks/reads.py)."""
        return await reads.get(self.store, tenant, task_id)

    async def sent_runs(self, shard: int, tasks: Sequence[Task]) -> set[str]:
        """Which of `tasks` say scheduled but were sent (timewheel/tasks/reads.py)."""
        return await reads.sent_runs(self.store, shard, tasks)

    def cancel_call(self, tenant: str, task_id: str, now_ms: int | None = None) -> Call[Task]:
        shard = self.store.locate(task_id)
        k = self.store.keys
        return Call(
            self.store.scripts.task_cancel,
            [k.meta(shard), k.events(shard)],
            [task_id, tenant, *self.store.shared(shard, now_ms, wake=False)],
            _changed(task_id, "cancel"),
        )

    async def cancel(self, tenant: str, task_id: str, *, now_ms: int | None = None) -> Task:
        """Cancel a scheduled task. Raises TaskNotFound, or InvalidState once dispatched."""
        return await self.store.write(self.cancel_call(tenant, task_id, now_ms))

    def update_call(
        self,
        tenant: str,
        task_id: str,
        *,
        run_at_ms: int | None = None,
        delay_ms: int | None = None,
        payload_json: str | None = None,
        now_ms: int | None = None,
    ) -> Call[Task]:
        shard = self.store.locate(task_id)
        k = self.store.keys
        return Call(
            self.store.scripts.task_update,
            [k.meta(shard), k.events(shard)],
            [
                task_id,
                tenant,
                clock_arg(run_at_ms),
                clock_arg(delay_ms),
                payload_json or "",
                *self.store.shared(shard, now_ms),
            ],
            _changed(task_id, "reschedule"),
        )

    async def update(
        self,
        tenant: str,
        task_id: str,
        *,
        run_at_ms: int | None = None,
        delay_ms: int | None = None,
        payload_json: str | None = None,
        now_ms: int | None = None,
    ) -> Task:
        """Reschedule and/or replace the payload of a scheduled task.

        Raises:
            TaskNotFound: unknown id or another tenant's.
            InvalidState: the task is no longer scheduled.
            PayloadTooLarge: the new payload is over the limit.
        """
        if payload_json is not None:
            self.check_payload(payload_json)
        call = self.update_call(
            tenant,
            task_id,
            run_at_ms=run_at_ms,
            delay_ms=delay_ms,
            payload_json=payload_json,
            now_ms=now_ms,
        )
        return await self.store.write(call)
