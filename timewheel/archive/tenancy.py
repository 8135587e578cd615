"""Tenants, their limits and API key hashes in PostgreSQL, and back into Redis on restore.

Tenants live in global keys (timewheel/tenants.py): `<prefix>:tenants` (id -> JSON of
limits and created_ms), `<prefix>:apikeys` (SHA-256 of a key -> JSON tenant, key_id,
role) and `<prefix>:tenantkeys:<id>` (key id -> hash). Only hashes are ever stored; a
key itself is shown once, when it is issued, and is in neither Redis nor PostgreSQL.

How they reach PostgreSQL (tables `tenants` and `api_keys`, migration 0003):

- The change log. Every change of a tenant or of its keys adds `{e: tenant, id}` to the
  global stream `<prefix>:tenantlog`. The archiver reads it after its checkpoint (row
  `shard = -1` of archive_checkpoints), reads each named tenant as it is now (its JSON,
  its keys and their hashes) and writes it in the same transaction as the checkpoint:
  the tenant upserted (deleted when gone), its keys upserted, and its keys PostgreSQL
  knows that are no longer in Redis marked revoked (`revoked_at`). Reading the state,
  not the entry, means a later state wins, as for schedules.
- The snapshot copies every tenant and key (HSCAN of the two hashes), and marks revoked
  the keys PostgreSQL knows, first seen before the snapshot began, that Redis no longer
  has: a change whose log entry was lost (a process died between the change and the
  entry) is in PostgreSQL after the next snapshot.

Restore writes every tenant, and every key not revoked into both key hashes: old keys
work again, revoked ones stay revoked.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from redis.exceptions import RedisError

from timewheel.archive.events import StreamId, format_id, parse_id
from timewheel.errors import PostgresUnavailable, RedisUnavailable
from timewheel.store.connection import RedisClient
from timewheel.store.keys import Keys

LOG_SHARD = -1
"""The archive_checkpoints row of the tenant change log."""
SCAN_COUNT = 1000


@dataclass(frozen=True, slots=True)
class TenantCopy:
    """One tenant as Redis holds it: its JSON (None: gone) and its keys, hash -> info JSON."""

    tenant_id: str
    definition: str | None
    keys: dict[str, str]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def read_log(
    client: RedisClient, keys: Keys, checkpoint: StreamId | None, count: int
) -> tuple[list[str], StreamId | None]:
    """(tenant ids named, newest entry id read) of up to `count` log entries after
    `checkpoint`; ([], None) when there are none."""
    start = "-" if checkpoint is None else "(" + format_id(checkpoint)
    try:
        entries: Any = await client.xrange(keys.tenant_log(), min=start, max="+", count=count)
    except (RedisError, OSError) as exc:
        raise RedisUnavailable(f"cannot read the tenant log: {exc}") from exc
    if not entries:
        return [], None
    named = [_text(f[b"id"]) for _, f in entries if b"id" in f]
    return list(dict.fromkeys(named)), parse_id(entries[-1][0])


async def read_tenants(
    client: RedisClient, keys: Keys, tenant_ids: Sequence[str]
) -> list[TenantCopy]:
    """Each tenant as it is now: its JSON and its keys (two pipelined round trips)."""
    if not tenant_ids:
        return []
    try:
        pipe = client.pipeline(transaction=False)
        for tid in tenant_ids:
            pipe.hget(keys.tenants(), tid)
            pipe.hgetall(keys.tenant_keys(tid))
        replies: list[Any] = await pipe.execute()
        digests = [
            sorted(_text(d) for d in (replies[2 * i + 1] or {}).values())
            for i in range(len(tenant_ids))
        ]
        flat = [d for ds in digests for d in ds]
        infos: list[Any] = await client.hmget(keys.api_keys(), flat) if flat else []
    except (RedisError, OSError) as exc:
        raise RedisUnavailable(f"cannot read tenants: {exc}") from exc
    info_of = {d: _text(i) for d, i in zip(flat, infos, strict=True) if i is not None}
    out = []
    for i, tid in enumerate(tenant_ids):
        raw = replies[2 * i]
        out.append(
            TenantCopy(
                tid,
                None if raw is None else _text(raw),
                {d: info_of[d] for d in digests[i] if d in info_of},
            )
        )
    return out


async def write_tenants(
    cur: psycopg.AsyncCursor[tuple[object, ...]], copies: Iterable[TenantCopy]
) -> None:
    """Store tenants read from Redis: upsert each (delete when gone), upsert its keys,
    and mark revoked its keys PostgreSQL knows that Redis no longer has."""
    for c in copies:
        if c.definition is None:
            await cur.execute("DELETE FROM tenants WHERE tenant_id = %s", (c.tenant_id,))
        else:
            await cur.execute(
                "INSERT INTO tenants (tenant_id, definition) VALUES (%s, %s)"
                " ON CONFLICT (tenant_id) DO UPDATE SET definition = EXCLUDED.definition,"
                " updated_at = clock_timestamp()",
                (c.tenant_id, c.definition),
            )
        await _upsert_keys(cur, c.keys)
        await cur.execute(
            "UPDATE api_keys SET revoked_at = clock_timestamp() WHERE tenant = %s"
            " AND revoked_at IS NULL AND NOT (digest = ANY(%s))",
            (c.tenant_id, list(c.keys)),
        )


async def _upsert_keys(cur: psycopg.AsyncCursor[tuple[object, ...]], found: dict[str, str]) -> None:
    rows = []
    for digest, info in found.items():
        data = json.loads(info)
        rows.append(
            (
                digest,
                data.get("tenant"),
                str(data.get("key_id", "")),
                str(data.get("role", "")),
                info,
            )
        )
    if rows:
        await cur.executemany(
            "INSERT INTO api_keys (digest, tenant, key_id, role, info) VALUES (%s, %s, %s, %s, %s)"
            " ON CONFLICT (digest) DO UPDATE SET info = EXCLUDED.info, revoked_at = NULL",
            rows,
        )


async def copy_all(
    client: RedisClient, keys: Keys, cur: psycopg.AsyncCursor[tuple[object, ...]]
) -> tuple[int, int]:
    """The snapshot's copy of every tenant and key; returns (tenants, keys)."""
    await cur.execute("SELECT clock_timestamp()")
    started = await cur.fetchone()
    assert started is not None
    tenants: list[tuple[str, str]] = []
    found: dict[str, str] = {}
    try:
        async for tid, raw in client.hscan_iter(keys.tenants(), count=SCAN_COUNT):
            tenants.append((_text(tid), _text(raw)))
        async for digest, info in client.hscan_iter(keys.api_keys(), count=SCAN_COUNT):
            found[_text(digest)] = _text(info)
    except (RedisError, OSError) as exc:
        raise RedisUnavailable(f"cannot copy tenants: {exc}") from exc
    if tenants:
        await cur.executemany(
            "INSERT INTO tenants (tenant_id, definition) VALUES (%s, %s)"
            " ON CONFLICT (tenant_id) DO UPDATE SET definition = EXCLUDED.definition,"
            " updated_at = clock_timestamp()",
            tenants,
        )
    await _upsert_keys(cur, found)
    await cur.execute(
        "UPDATE api_keys SET revoked_at = clock_timestamp() WHERE revoked_at IS NULL"
        " AND seen_at < %s AND NOT (digest = ANY(%s))",
        (started[0], list(found)),
    )
    return len(tenants), len(found)


@dataclass(frozen=True, slots=True)
class ArchivedTenants:
    """What restore writes: tenants (id, JSON) and live keys (hash, tenant, key id, info)."""

    tenants: list[tuple[str, str]]
    keys: list[tuple[str, str | None, str, str]]
    revoked: int


async def load(conn: psycopg.AsyncConnection[tuple[object, ...]]) -> ArchivedTenants:
    """Every archived tenant and key (revoked ones only counted)."""
    try:
        cur = await conn.execute("SELECT tenant_id, definition FROM tenants ORDER BY tenant_id")
        tenants = [(str(t), _json_text(d)) for t, d in await cur.fetchall()]
        cur = await conn.execute(
            "SELECT digest, tenant, key_id, info FROM api_keys WHERE revoked_at IS NULL"
        )
        live = [
            (str(d), None if t is None else str(t), str(k), _json_text(i))
            for d, t, k, i in await cur.fetchall()
        ]
        cur = await conn.execute("SELECT count(*) FROM api_keys WHERE revoked_at IS NOT NULL")
        row = await cur.fetchone()
    except psycopg.Error as exc:
        raise PostgresUnavailable(f"cannot read archived tenants: {exc}") from exc
    return ArchivedTenants(tenants, live, int(str(row[0])) if row else 0)


def _json_text(value: object) -> str:
    """A jsonb column as JSON text (psycopg gives it parsed)."""
    return value if isinstance(value, str) else json.dumps(value)


BATCH = 500


async def write_back(client: RedisClient, keys: Keys, archived: ArchivedTenants) -> None:
    """Write archived tenants and live keys into Redis (HSETNX: a forced restore keeps
    what is there). A tenant's keys hash gets its key ids; the key hash its info."""
    try:
        for i in range(0, len(archived.tenants), BATCH):
            pipe = client.pipeline(transaction=False)
            for tid, definition in archived.tenants[i : i + BATCH]:
                pipe.hsetnx(keys.tenants(), tid, definition)
            await pipe.execute()
        for i in range(0, len(archived.keys), BATCH):
            pipe = client.pipeline(transaction=False)
            for digest, tenant, key_id, info in archived.keys[i : i + BATCH]:
                pipe.hsetnx(keys.api_keys(), digest, info)
                if tenant is not None:
                    pipe.hsetnx(keys.tenant_keys(tenant), key_id, digest)
            await pipe.execute()
    except (RedisError, OSError) as exc:
        raise RedisUnavailable(f"cannot write tenants: {exc}") from exc
