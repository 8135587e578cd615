"""The only place Redis key names, hash tags and channels are built."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from timewheel.store.bodies import BodyLayout

WHEEL_LEVELS = 4
"""A far bucket and its children, level by level (lua/lib/wheel.lua WHEEL_LEVELS)."""
WHEEL_DISTANT = 16
"""A distant bucket's width in far buckets (lua/lib/wheel.lua WHEEL_DISTANT) ..."""
WHEEL_DISTANT_MIN_MS = 3_600_000
"""... and an hour at least (WHEEL_DISTANT_MIN_MS)."""


@dataclass(frozen=True, slots=True)
class Keys:
    """Key names of one deployment.

    Every key of shard n starts with the tag ``{<prefix>:<n>}:`` so one Lua call touches
    one cluster slot. Lua scripts derive further keys from the tag they are given
    (see the headers in lua/); the suffixes here and there must agree.
    """

    prefix: str = "tw"

    def tag(self, shard: int) -> str:
        """The key prefix of a shard, hash tag included, e.g. ``{tw:3}:``."""
        return f"{{{self.prefix}:{shard}}}:"

    def meta(self, shard: int) -> str:
        """HASH: hwm, promoted_until, scan cursors of the shard."""
        return self.tag(shard) + "meta"

    def due(self, shard: int) -> str:
        """ZSET tenant -> earliest near-level due_ms."""
        return self.tag(shard) + "due"

    def near(self, shard: int, tenant: str) -> str:
        """ZSET run_id -> due_ms: a tenant's runs due before promoted_until."""
        return self.tag(shard) + "near:" + tenant

    def wheel(self, shard: int) -> str:
        """ZSET of far-level bucket starts."""
        return self.tag(shard) + "wheel"

    def bucket(self, shard: int, bucket_start_ms: int) -> str:
        """HASH member -> '' of one far-level time bucket (see bucket_member); a full one
        splits into children (bucket_path)."""
        return f"{self.tag(shard)}w:{bucket_start_ms}"

    def bucket_path(self, shard: int, bucket_start_ms: int, member: str) -> list[str]:
        """The far buckets a member of one time bucket may be in, level by level: the
        bucket, then the children it splits into once full, chosen by the hex digits of
        the member's SHA-1 (lua/lib/wheel.lua wheel_path), e.g. ``w:<start>``,
        ``w:<start>:a``, ``w:<start>:a7``, ``w:<start>:a7e``."""
        base = self.bucket(shard, bucket_start_ms)
        digest = hashlib.sha1(member.encode()).hexdigest()
        return [base] + [f"{base}:{digest[:level]}" for level in range(1, WHEEL_LEVELS)]

    def distant(self, shard: int) -> str:
        """ZSET of distant bucket starts (lua/lib/wheel.lua)."""
        return self.tag(shard) + "distant"

    def far_path(self, shard: int, due_ms: int, bucket_ms: int, member: str) -> list[str]:
        """Every bucket a run due at `due_ms` may wait in: its far bucket's path
        (bucket_path), then its distant bucket's (``wd:<start>`` and its children, a
        bucket WHEEL_DISTANT far buckets wide, an hour at least)."""
        width = max(bucket_ms * WHEEL_DISTANT, WHEEL_DISTANT_MIN_MS)
        digest = hashlib.sha1(member.encode()).hexdigest()
        distant = f"{self.tag(shard)}wd:{due_ms - due_ms % width}"
        return (
            self.bucket_path(shard, due_ms - due_ms % bucket_ms, member)
            + [distant]
            + [f"{distant}:{digest[:level]}" for level in range(1, WHEEL_LEVELS)]
        )

    @staticmethod
    def bucket_member(run_id: str) -> str:
        """A run's field in a far bucket: its id without the 3 shard characters, which
        the key's tag implies (lua/lib/wheel.lua)."""
        return run_id[3:]

    def expiry(self, shard: int) -> str:
        """ZSET of finish-bucket starts of records kept for the retention window."""
        return self.tag(shard) + "expiry"

    def retained(self, shard: int, bucket_start_ms: int) -> str:
        """LIST of the runs that finished in one finish bucket (lua/lib/wheel.lua); an
        earlier version kept a HASH run id -> '' under legacy_retained."""
        return f"{self.tag(shard)}xl:{bucket_start_ms}"

    def legacy_retained(self, shard: int, bucket_start_ms: int) -> str:
        return f"{self.tag(shard)}x:{bucket_start_ms}"

    def body(self, shard: int, run_id: str, layout: BodyLayout) -> str:
        """HASH field -> record: the body hash of a run in a shard of that body layout
        (store/bodies.py); `body_field` gives its field."""
        return layout.place(self.tag(shard), run_id)[0]

    @staticmethod
    def body_field(run_id: str, layout: BodyLayout) -> str:
        """A run's field in its body hash (store/bodies.py)."""
        return layout.place("", run_id)[1]

    def schedule(self, shard: int, sid: str) -> str:
        """HASH: a recurring schedule (fields in lua/lib/schedule.lua)."""
        return f"{self.tag(shard)}s:{sid}"

    def schedule_runs(self, shard: int, sid: str) -> str:
        """ZSET run_id -> fire ms: a schedule's materialized runs not yet dispatched."""
        return f"{self.tag(shard)}sr:{sid}"

    def schedules(self, shard: int) -> str:
        """SET of every schedule id of the shard (snapshots read it)."""
        return self.tag(shard) + "schedules"

    def plan_tenants(self, shard: int) -> str:
        """ZSET tenant -> the earliest next fire time of its plan index: the tenants whose
        schedules the planner extends, each visited for a share of a pass."""
        return self.tag(shard) + "plan_tenants"

    def plan(self, shard: int, tenant: str) -> str:
        """ZSET sid -> next fire time not yet materialized: a tenant's schedules the
        planner extends."""
        return f"{self.tag(shard)}plan:{tenant}"

    def legacy_plan(self, shard: int) -> str:
        """ZSET sid -> next fire time: the single plan index of earlier library versions,
        emptied into the per-tenant ones by lua/schedule_due.lua."""
        return self.tag(shard) + "plan"

    def usage(self, shard: int, tenant: str) -> str:
        """HASH runs, bytes, schedules, q:<queue>: what the tenant holds in this shard,
        kept by the Lua operations that change it (lua/lib/usage.lua; timewheel/limits.py)."""
        return f"{self.tag(shard)}use:{tenant}"

    def stream(self, shard: int, tenant: str, queue: str) -> str:
        """STREAM of dispatched runs of one (tenant, queue) in one shard."""
        return f"{self.tag(shard)}q:{tenant}:{queue}"

    def dead(self, shard: int, tenant: str) -> str:
        """STREAM of a tenant's dead-lettered runs in one shard."""
        return f"{self.tag(shard)}dead:{tenant}"

    def groups(self, shard: int) -> str:
        """SET of '<group>|<stream key>': the consumer groups the reaper watches."""
        return self.tag(shard) + "groups"

    def events(self, shard: int) -> str:
        """STREAM: the shard's capped event log."""
        return self.tag(shard) + "events"

    def rates(self, shard: int) -> str:
        """HASH tenant -> runs/s the tick may send for it from this shard: its
        dispatch_rate split over its shards (timewheel/dispatch/rates.py; read by
        lua/dispatch_tick.lua)."""
        return self.tag(shard) + "rates"

    def caps(self, shard: int) -> str:
        """HASH tenant -> its own max_backlog per ready stream (0: none), copied from its
        limits (timewheel/dispatch/rates.py; read by lua/lib/park.lua)."""
        return self.tag(shard) + "caps"

    def parked(self, shard: int) -> str:
        """HASH '<tenant>:<queue>' -> '': the pairs with runs parked (lua/lib/park.lua)."""
        return self.tag(shard) + "parked"

    def park(self, shard: int, tenant: str, queue: str) -> str:
        """ZSET run_id -> due_ms: a (tenant, queue)'s runs parked while its ready stream is
        over its backlog cap; their records say scheduled (lua/lib/park.lua)."""
        return f"{self.tag(shard)}park:{tenant}:{queue}"

    def tokens(self, shard: int) -> str:
        """HASH tenant -> 'tokens:stamp_ms': the tick's token buckets (lua/lib/rate.lua)."""
        return self.tag(shard) + "tokens"

    def audit_scratch(self, shard: int, pass_id: str) -> str:
        """HASH run id -> attempt, with a short TTL: the runs an audit pass found out
        (dispatched) in the shard and has not yet seen in their ready stream
        (lua/audit_records.lua, audit_stream.lua, audit_confirm.lua)."""
        return f"{self.tag(shard)}audit:{pass_id}"

    def lease(self, shard: int) -> str:
        """STRING '<node>/<epoch>' with a TTL: who may run scheduler scripts on the shard."""
        return self.tag(shard) + "lease"

    def auditor_lease(self) -> str:
        """STRING '<node>/<epoch>' with a TTL: the scheduler node that runs the continuous
        auditor (timewheel/audit/continuous.py). Shares its tag with auditor_meta and
        audit_latest, so one call may touch all three on a Cluster."""
        return f"{{{self.prefix}:audit}}:lease"

    def auditor_meta(self) -> str:
        """HASH epoch: the auditor lease's fencing counter (lua/lease_acquire.lua)."""
        return f"{{{self.prefix}:audit}}:meta"

    def audit_latest(self) -> str:
        """STRING: JSON of the latest complete continuous audit pass, bounded in size,
        written only by the auditor lease's holder (lua/audit_publish.lua)."""
        return f"{{{self.prefix}:audit}}:latest"

    def nodes(self) -> str:
        """ZSET node id -> when it last announced itself, ms (lua/lease_members.lua): the
        live scheduler nodes."""
        return f"{self.prefix}:nodes"

    def layout(self) -> str:
        """HASH shards, bucket_ms: fixed when a deployment is created, checked at start."""
        return f"{self.prefix}:layout"

    def wake_channel(self) -> str:
        """Pub/sub channel on which creates announce a shard whose next due time moved earlier."""
        return f"{self.prefix}:wake"

    def tenants(self) -> str:
        """HASH tenant id -> JSON {limits, created_ms}: the registered tenants (global key)."""
        return f"{self.prefix}:tenants"

    def api_keys(self) -> str:
        """HASH sha256 hex of an API key -> JSON {tenant, key_id, role} (global key).
        Only hashes are stored: a key is shown once, when it is issued."""
        return f"{self.prefix}:apikeys"

    def tenant_keys(self, tenant: str) -> str:
        """HASH key id -> sha256 hex: a tenant's keys, so one can be revoked by its id."""
        return f"{self.prefix}:tenantkeys:{tenant}"

    def tenant_log(self) -> str:
        """STREAM {e, id, at}: one entry per change of a tenant or of its keys (global
        key), which the archiver tails into PostgreSQL (timewheel/archive/tenancy.py)."""
        return f"{self.prefix}:tenantlog"

    def shard_of_key(self, key: str) -> int:
        """The shard number in a key built here."""
        start = key.index("{") + len(self.prefix) + 2
        return int(key[start : key.index("}", start)])
