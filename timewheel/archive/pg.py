"""PostgreSQL: connecting with our errors, and the schema migrations in
timewheel/archive/migrations/.

Migrations are plain SQL files named `NNNN_name.sql`, applied in order of NNNN, each in
its own transaction together with its row in `schema_migrations`. An advisory lock
keeps two archivers starting at once from applying the same file twice.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources

import psycopg
import structlog

from timewheel.errors import ConfigError, PostgresUnavailable

log = structlog.get_logger("timewheel.pg")

_MIGRATION = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_LOCK_KEY = 0x74770001  # pg_advisory_xact_lock key of the migrator ("tw" + 1)
CONNECT_TIMEOUT_S = 10


@dataclass(frozen=True, slots=True)
class Migration:
    """One SQL file of timewheel/archive/migrations/."""

    version: int
    name: str
    sql: str


def migrations() -> list[Migration]:
    """Every migration shipped in the package, oldest first."""
    found: list[Migration] = []
    for entry in resources.files("timewheel.archive").joinpath("migrations").iterdir():
        match = _MIGRATION.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text()))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise ConfigError(f"two migrations share a version number: {versions}")
    return found


def _describe(exc: BaseException) -> str:
    """The first line of a psycopg error (its messages can span lines with hints)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


async def connect(dsn: str) -> psycopg.AsyncConnection[tuple[object, ...]]:
    """An open connection to `dsn`.

    Raises:
        ConfigError: the DSN is empty or malformed.
        PostgresUnavailable: the server cannot be reached or refuses the login.
    """
    if not dsn:
        raise ConfigError("no PostgreSQL DSN: pass --postgres-dsn or set TIMEWHEEL_POSTGRES_DSN")
    try:
        psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise ConfigError(f"PostgreSQL DSN is malformed: {_describe(exc)}") from exc
    try:
        return await psycopg.AsyncConnection.connect(dsn, connect_timeout=CONNECT_TIMEOUT_S)
    except psycopg.Error as exc:
        raise PostgresUnavailable(f"cannot connect to PostgreSQL: {_describe(exc)}") from exc


@asynccontextmanager
async def connection(dsn: str) -> AsyncIterator[psycopg.AsyncConnection[tuple[object, ...]]]:
    """`connect` as a context manager that closes the connection and maps psycopg errors."""
    conn = await connect(dsn)
    try:
        yield conn
    except psycopg.Error as exc:
        raise PostgresUnavailable(f"PostgreSQL statement failed: {_describe(exc)}") from exc
    finally:
        await conn.close()


async def migrate(conn: psycopg.AsyncConnection[tuple[object, ...]]) -> list[int]:
    """Apply the migrations not yet applied; returns the versions applied now."""
    applied_now: list[int] = []
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        cur = await conn.execute("SELECT version FROM schema_migrations")
        done = {int(str(row[0])) for row in await cur.fetchall()}
        for migration in migrations():
            if migration.version in done:
                continue
            # Each file runs inside this transaction: all of them apply, or none.
            await conn.execute(migration.sql.encode())
            await conn.execute(
                "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                (migration.version, migration.name),
            )
            applied_now.append(migration.version)
            log.info("migration_applied", version=migration.version, name=migration.name)
    return applied_now
