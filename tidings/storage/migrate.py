"""Schema migrations: numbered SQL files applied in order, once each.

They run at start under a PostgreSQL advisory lock, so two processes that
start together on one database apply each migration exactly once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib import resources

import asyncpg

from tidings.storage.connection import Connection

log = logging.getLogger(__name__)

# How long a migration waits for each lock it needs before it gives way, and
# how long it pauses before it tries again. Processes of the version before
# may run on the same database (a rolling upgrade): every statement of
# theirs on a table queues behind a lock a migration waits for, so waiting
# as long as a report or a dump reads would stall their traffic as long.
LOCK_TIMEOUT_MS = 2000
RETRY_PAUSE_SECONDS = 1.0

# "tidi" in ASCII: the advisory lock every Tidings process takes to migrate.
MIGRATION_LOCK = 0x74696469

CREATE_MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
)
"""
TABLE_EXISTS = "SELECT to_regclass('schema_migrations') IS NOT NULL"
SELECT_APPLIED = "SELECT version FROM schema_migrations"
INSERT_APPLIED = "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)"


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def load_migrations() -> list[Migration]:
    folder = resources.files("tidings.storage") / "migrations"
    found = []
    for entry in folder.iterdir():
        if not entry.name.endswith(".sql"):
            continue
        number, _, rest = entry.name.partition("_")
        found.append(Migration(int(number), rest.removesuffix(".sql"), entry.read_text()))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"two migrations share a number: {versions}")
    return found


async def migrate(conn: Connection) -> list[str]:
    """Apply the migrations this database lacks; return their names.

    Each migration commits on its own. Cancelled midway, the database holds
    the migrations applied so far and the next start applies the rest.
    """
    await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK)
    try:
        # Only if missing: CREATE TABLE IF NOT EXISTS needs the right to
        # create, which a role that only uses a migrated database lacks.
        if not await conn.fetchval(TABLE_EXISTS):
            await conn.execute(CREATE_MIGRATIONS_TABLE)
        applied = {row["version"] for row in await conn.fetch(SELECT_APPLIED)}
        done = []
        for migration in load_migrations():
            if migration.version in applied:
                continue
            await _apply(conn, migration)
            done.append(f"{migration.version:04d}_{migration.name}")
        return done
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK)


async def _apply(conn: Connection, migration: Migration) -> None:
    """One migration in its own transaction, each lock waited for at most
    LOCK_TIMEOUT_MS: tried again after a pause until it gets them all."""
    waited = False
    while True:
        try:
            async with conn.transaction():
                await conn.execute(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}")
                await conn.execute(migration.sql)
                await conn.execute(INSERT_APPLIED, migration.version, migration.name)
            return
        except asyncpg.LockNotAvailableError:
            if not waited:
                log.warning("migration %04d_%s waits for a table another session holds "
                            "(a long query or transaction); trying again every %g s",
                            migration.version, migration.name, RETRY_PAUSE_SECONDS)
                waited = True
            await conn.execute("SELECT pg_sleep($1)", RETRY_PAUSE_SECONDS)


async def missing_migrations(conn: Connection) -> list[str]:
    """The migrations this code has that the database lacks (all, without the table)."""
    exists = await conn.fetchval(TABLE_EXISTS)
    applied = {row["version"] for row in await conn.fetch(SELECT_APPLIED)} if exists else set()
    return [f"{m.version:04d}_{m.name}" for m in load_migrations() if m.version not in applied]
