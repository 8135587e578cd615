"""Tenants, their limits and API keys, stored in Redis under global (non-shard) keys.

Keys are `tw_` + 43 url-safe characters (256 random bits); only their SHA-256 is stored,
and a key is looked up by its hash (HGET), so no comparison of key bytes happens at all;
the bootstrap admin key's hash is compared with `hmac.compare_digest` (constant time).
The API process caches lookups for `CACHE_TTL_S` (1 s): a revoked key stops working
within 1 s in every api process, and a changed limit applies within 1 s.

Limits: a tenant's own values (None: the deployment's default, Settings.tenant_*), stored
in the tenant's JSON; what applies and how creates are checked is timewheel/limits.py.
Only the limits a tenant sets are written, and a reader takes the fields it knows, so
processes of two versions side by side read each other's tenants. The limit `shards`
(how many shards the tenant's new tasks spread over) also writes the list chosen and
the union of every list before into the record (`shards`, `shards_used`: see
timewheel/store/placement.py).

Every change (a tenant created, its limits changed, a key issued or revoked) then adds
an entry naming the tenant to the change log `<prefix>:tenantlog`, which the archiver
tails into PostgreSQL, so a restore brings tenants, limits and key hashes back
(timewheel/archive/tenancy.py). The entry follows the change: a process dying between
the two leaves the change to the next snapshot, which copies every tenant and key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import structlog
from redis.exceptions import RedisError, WatchError

from timewheel.dispatch.rates import DispatchRates
from timewheel.errors import ConfigError, Conflict, NotFound, RedisUnavailable, Unauthorized
from timewheel.store import placement
from timewheel.store.connection import RedisClient
from timewheel.store.keys import Keys
from timewheel.store.placement import Placement, Placements

CACHE_TTL_S = 1.0
LOG_MAXLEN = 100_000
"""Approximate length the change log is trimmed to (the archiver reads it every round)."""
UPDATE_TRIES = 20
"""How often update_limits reads again when a concurrent change got in first."""
log = structlog.get_logger("timewheel.tenants")

ADMIN = "admin"
TENANT = "tenant"


@dataclass(frozen=True, slots=True)
class Limits:
    """A tenant's own limits; None means the deployment's default (Settings.tenant_*,
    max_payload_bytes; no limit for dispatch_rate). What each counts, how exactly, and
    the answer over it: docs/guides/tenants-and-limits.md."""

    max_payload_bytes: int | None = None
    """Largest payload, encoded JSON bytes (never above the deployment's max_payload_bytes)."""
    max_pending: int | None = None
    """Most runs not finished at once (scheduled, in flight, waiting for a retry); over
    it, a create answers 429."""
    dispatch_rate: float | None = None
    """Most runs per second the tick dispatches for the tenant, retries included; the rest
    wait, due, in the near level (timewheel/dispatch/rates.py, lua/dispatch_tick.lua)."""
    max_payload_total_bytes: int | None = None
    """Most payload bytes held at once: runs not finished, dead letters, schedules; 429."""
    max_schedules: int | None = None
    """Most schedules; 429."""
    max_queues: int | None = None
    """Most queues in use at once (a queue with runs not finished or a schedule); 429."""
    min_interval_s: float | None = None
    """Shortest time between two fire times of a schedule; a closer one answers 422."""
    max_backlog: int | None = None
    """Most undelivered entries (not yet read by a consumer) in each of the tenant's ready
    streams, one per (shard, queue); past it the tick parks the queue's due runs in the
    wheel, never drops them (lua/lib/park.lua). 0: no cap; None: Settings.tenant_max_backlog."""
    shards: int | None = None
    """How many shards the tenant's new tasks and schedules spread over (1..Settings.shards;
    None: Settings.default_spread). Its tasks already made stay in theirs."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Limits:
        """Limits as stored: fields this version does not know are left out."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def to_json(self) -> dict[str, Any]:
        """Every limit, None where the default applies (as the API answers)."""
        return asdict(self)

    def stored(self) -> dict[str, Any]:
        """The limits set, as stored (a process of an older version reads these)."""
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True, slots=True)
class Tenant:
    id: str
    limits: Limits
    created_ms: int
    placement: Placement | None = None
    """Its shards, where the store knows the deployment's (store/placement.py)."""

    def to_json(self) -> dict[str, Any]:
        out = {"id": self.id, "limits": self.limits.to_json(), "created_at_ms": self.created_ms}
        if self.placement is not None:
            out["shards"] = list(self.placement.shards)
            out["shards_used"] = list(self.placement.used)
        return out


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request is: an admin key, or a key of one tenant."""

    role: str
    tenant: str | None
    key_id: str


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    """A fresh API key: 256 random bits."""
    return "tw_" + secrets.token_urlsafe(32)


def _err(exc: Exception) -> RedisUnavailable:
    return RedisUnavailable(f"tenant store: {exc}")


class TenantStore:
    """Tenants and keys of one deployment, with a short cache of lookups (per instance)."""

    def __init__(
        self,
        client: RedisClient,
        keys: Keys,
        *,
        admin_key: str = "",
        rates: DispatchRates | None = None,
        placements: Placements | None = None,
    ):
        self.client = client
        self.keys = keys
        self.rates = rates
        """Where a dispatch_rate is copied for the tick (else only the schedulers' sync does)."""
        self.placements = placements
        """The deployment's placements: needed to set `shards`; told of every change."""
        self._admin_hash = hash_key(admin_key) if admin_key else ""
        self._principals: dict[str, tuple[float, Principal | None]] = {}
        self._tenants: dict[str, tuple[float, Tenant | None]] = {}

    async def _logged(self, tenant_id: str) -> None:
        """Name the tenant in the change log (after its change; see the module's text)."""
        fields = {"e": "tenant", "id": tenant_id, "at": int(time.time() * 1000)}
        try:
            await self.client.xadd(
                self.keys.tenant_log(),
                fields,  # type: ignore[arg-type]
                maxlen=LOG_MAXLEN,
                approximate=True,
            )
        except (RedisError, OSError) as exc:
            log.warning("tenant_log_failed", tenant=tenant_id, error=str(exc))

    # -- tenants ------------------------------------------------------------------

    def _place(self, tenant_id: str, data: dict[str, Any], count: int | None) -> None:
        """Write the tenant's shard list for a spread of `count` into its record."""
        if self.placements is None:
            raise ConfigError("setting a tenant's shards needs the deployment's settings")
        data.update(
            placement.changed(tenant_id, data, count, self.placements.settings, self.client)
        )

    def _tenant(self, tenant_id: str, data: Mapping[str, Any]) -> Tenant:
        place = None if self.placements is None else self.placements.learn(tenant_id, data)
        return Tenant(tenant_id, Limits.from_json(data["limits"]), int(data["created_ms"]), place)

    async def create_tenant(self, tenant_id: str, limits: Limits) -> Tenant:
        """Register a tenant. Raises Conflict if the id exists."""
        data: dict[str, Any] = {"limits": limits.stored(), "created_ms": int(time.time() * 1000)}
        if limits.shards is not None:
            self._place(tenant_id, data, limits.shards)
        try:
            added = await self.client.hsetnx(self.keys.tenants(), tenant_id, json.dumps(data))
        except (RedisError, OSError) as exc:
            raise _err(exc) from exc
        if not added:
            raise Conflict(f"tenant {tenant_id!r} exists already")
        await self._logged(tenant_id)
        tenant = self._tenant(tenant_id, data)
        if self.rates is not None and limits.dispatch_rate:
            used = tenant.placement.used if tenant.placement is not None else ()
            await self.rates.put(tenant_id, limits.dispatch_rate, used)
        if self.rates is not None and limits.max_backlog is not None:
            used = tenant.placement.used if tenant.placement is not None else ()
            await self.rates.put_cap(tenant_id, limits.max_backlog, used)
        self._tenants.pop(tenant_id, None)
        return tenant

    async def update_limits(self, tenant_id: str, changes: Mapping[str, Any]) -> Tenant:
        """Change some of a tenant's limits (a None value clears one); the others stay.
        Atomic against a concurrent update (WATCH). Raises NotFound."""
        key = self.keys.tenants()
        try:
            async with self.client.pipeline(transaction=True) as pipe:
                for _ in range(UPDATE_TRIES):
                    try:
                        await pipe.watch(key)
                        raw = await pipe.hget(key, tenant_id)
                        if raw is None:
                            raise NotFound(f"tenant {tenant_id!r} not found")
                        data = json.loads(raw)
                        merged = {**data["limits"], **changes}
                        data["limits"] = {k: v for k, v in merged.items() if v is not None}
                        if "shards" in changes:
                            self._place(tenant_id, data, changes["shards"])
                        pipe.multi()  # type: ignore[no-untyped-call]
                        pipe.hset(key, tenant_id, json.dumps(data))
                        await pipe.execute()
                        break
                    except WatchError:
                        continue
                else:
                    raise Conflict(f"tenant {tenant_id!r} kept changing; try again")
        except (RedisError, OSError) as exc:
            raise _err(exc) from exc
        await self._logged(tenant_id)
        tenant = self._tenant(tenant_id, data)
        if self.rates is not None and ("dispatch_rate" in changes or "shards" in changes):
            used = tenant.placement.used if tenant.placement is not None else ()
            await self.rates.put(tenant_id, tenant.limits.dispatch_rate, used)
        if self.rates is not None and ("max_backlog" in changes or "shards" in changes):
            used = tenant.placement.used if tenant.placement is not None else ()
            await self.rates.put_cap(tenant_id, tenant.limits.max_backlog, used)
        self._tenants.pop(tenant_id, None)
        return tenant

    async def parked(self, tenant: Tenant) -> dict[str, int] | None:
        """queue -> the tenant's runs parked over its backlog cap (None: no rates store)."""
        if self.rates is None:
            return None
        used = tenant.placement.used if tenant.placement is not None else ()
        return await self.rates.parked(tenant.id, used)

    async def get_tenant(self, tenant_id: str, *, cached: bool = False) -> Tenant:
        """A tenant. Raises NotFound."""
        now = time.monotonic()
        hit = self._tenants.get(tenant_id)
        if cached and hit is not None and hit[0] > now:
            found = hit[1]
        else:
            try:
                raw = await self.client.hget(self.keys.tenants(), tenant_id)
            except (RedisError, OSError) as exc:
                raise _err(exc) from exc
            found = None
            if raw is not None:
                found = self._tenant(tenant_id, json.loads(raw))
            self._tenants[tenant_id] = (now + CACHE_TTL_S, found)
        if found is None:
            raise NotFound(f"tenant {tenant_id!r} not found")
        return found

    # -- keys ---------------------------------------------------------------------

    async def issue_key(self, tenant_id: str) -> tuple[str, str]:
        """A new key for an existing tenant: (key_id, key). The key is not stored."""
        await self.get_tenant(tenant_id)
        key, key_id = new_key(), "k" + secrets.token_hex(6)
        digest = hash_key(key)
        info = json.dumps({"tenant": tenant_id, "key_id": key_id, "role": TENANT})
        try:
            await self.client.hset(self.keys.tenant_keys(tenant_id), key_id, digest)
            await self.client.hset(self.keys.api_keys(), digest, info)
        except (RedisError, OSError) as exc:
            raise _err(exc) from exc
        await self._logged(tenant_id)
        return key_id, key

    async def revoke_key(self, tenant_id: str, key_id: str) -> None:
        """Revoke a key by its id; every api process stops taking it within CACHE_TTL_S.
        Raises NotFound for an unknown tenant or key id."""
        await self.get_tenant(tenant_id)
        try:
            digest = await self.client.hget(self.keys.tenant_keys(tenant_id), key_id)
            if digest is None:
                raise NotFound(f"key {key_id!r} of tenant {tenant_id!r} not found")
            await self.client.hdel(self.keys.api_keys(), digest)
            await self.client.hdel(self.keys.tenant_keys(tenant_id), key_id)
        except (RedisError, OSError) as exc:
            raise _err(exc) from exc
        await self._logged(tenant_id)
        self._principals.pop(digest.decode() if isinstance(digest, bytes) else digest, None)

    async def authenticate(self, authorization: str | None) -> Principal:
        """The principal of an `Authorization: Bearer <key>` header. Raises Unauthorized."""
        if not authorization or not authorization.startswith("Bearer "):
            raise Unauthorized("send Authorization: Bearer <api key>")
        digest = hash_key(authorization[7:].strip())
        if self._admin_hash and hmac.compare_digest(digest, self._admin_hash):
            return Principal(ADMIN, None, "bootstrap")
        now = time.monotonic()
        hit = self._principals.get(digest)
        if hit is not None and hit[0] > now:
            principal = hit[1]
        else:
            principal = await self._lookup(digest)
            if len(self._principals) > 10_000:  # bounded: unknown keys must not grow it
                self._principals.clear()
            self._principals[digest] = (now + CACHE_TTL_S, principal)
        if principal is None:
            raise Unauthorized("unknown or revoked API key")
        return principal

    async def _lookup(self, digest: str) -> Principal | None:
        try:
            raw = await self.client.hget(self.keys.api_keys(), digest)
        except (RedisError, OSError) as exc:
            raise _err(exc) from exc
        if raw is None:
            return None
        info = json.loads(raw)
        return Principal(info["role"], info.get("tenant"), info["key_id"])
