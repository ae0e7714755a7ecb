"""The connection pool, and the embedded PostgreSQL used when no DATABASE_URL is set."""

from __future__ import annotations

import logging
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import trio
import trio_asyncio
import triopg

from tidings.config import Config
from tidings.storage.migrate import migrate

log = logging.getLogger("tidings.storage")

# triopg has no type information; a connection is its proxy object.
Connection = Any

EMBEDDED_DATABASE = "tidings"


T = TypeVar("T")


async def _keep_session(conn: Any) -> None:
    """Pool connections go back without asyncpg's reset query (one round trip
    saved per request). Nothing in Tidings leaves session state behind on a
    pooled connection: LISTEN uses connections of its own, and advisory
    locks are released where they are taken."""


class Database:
    """The pool of one service process."""

    def __init__(self, pool: Any, url: str) -> None:
        self._pool = pool
        self.url = url

    async def run(self, unit: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run ``unit(conn, *args)`` on a pooled connection in one crossing to asyncio.

        Each await on a triopg connection crosses from trio to asyncio and
        back, which costs more CPU here than the query itself. A unit that
        only awaits its connection runs whole on the asyncio side instead:
        acquire, its queries, release, in one crossing. Cancellation while
        it runs cancels the asyncio task; the connection goes back to the pool.
        """
        return await trio_asyncio.aio_as_trio(self._run_on_asyncio)(unit, *args)  # type: ignore[no-any-return]

    async def _run_on_asyncio(self, unit: Callable[..., Awaitable[T]], *args: Any) -> T:
        # triopg's pool proxy wraps an asyncpg pool; use it directly here.
        async with self._pool._asyncpg_pool.acquire() as conn:
            return await unit(conn, *args)

    def acquire(self) -> Any:
        """``async with db.acquire() as conn``: a connection from the pool."""
        return self._pool.acquire()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Connection]:
        """A connection inside a transaction, committed when the block ends."""
        async with self._pool.acquire() as conn, conn.transaction():
            yield conn


def start_embedded(data_dir: Path) -> str:
    """Start (or join) the embedded PostgreSQL in ``data_dir``; return its admin URL.

    Blocking: run it in a thread. The server is shared by every process
    that uses the same data dir and stops when the last of them exits.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver

    data_dir.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(data_dir.resolve() / "pg", cleanup_mode="stop")
    return str(server.get_uri())


def with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + database))


async def ensure_database(admin_url: str, database: str) -> None:
    """Create ``database`` unless it exists (two processes may race: both succeed)."""
    async with triopg.connect(admin_url) as conn:
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", database)
        if exists:
            return
        try:
            await conn.execute(f'CREATE DATABASE "{database}"')
        except (asyncpg.DuplicateDatabaseError, asyncpg.UniqueViolationError):
            pass


async def resolve_url(config: Config) -> str:
    """The URL of the database to use: DATABASE_URL, or the embedded server's."""
    if config.database_url:
        return config.database_url
    admin_url = await trio.to_thread.run_sync(start_embedded, config.data_dir)
    await ensure_database(admin_url, EMBEDDED_DATABASE)
    return with_database(admin_url, EMBEDDED_DATABASE)


@asynccontextmanager
async def open_asyncio_bridge() -> AsyncIterator[None]:
    """The asyncio loop that triopg runs asyncpg on, unless one is already open."""
    if trio_asyncio.current_loop.get() is not None:
        yield
        return
    async with trio_asyncio.open_loop():
        yield


@asynccontextmanager
async def open_database(config: Config, *, run_migrations: bool = True) -> AsyncIterator[Database]:
    """Connect to the database (starting the embedded one if needed) and migrate it.

    Cancellation while opening leaves nothing behind but a possibly running
    embedded server, which the next start reuses.
    """
    async with open_asyncio_bridge():
        url = await resolve_url(config)
        async with triopg.create_pool(
            url, min_size=1, max_size=config.db_pool_size, command_timeout=60,
            reset=_keep_session,
        ) as pool:
            if run_migrations:
                async with pool.acquire() as conn:
                    applied = await migrate(conn)
                if applied:
                    log.info("applied migrations: %s", ", ".join(applied))
            yield Database(pool, url)


async def run_on(conn: Any, unit: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Run ``unit(conn, *args)`` on a connection the caller holds, in one crossing.

    ``Database.run`` for a connection already taken (a request's, inside its
    transaction when it has one): the unit's queries run whole on the asyncio
    side, on the asyncpg connection behind the triopg proxy.
    """
    raw = getattr(conn, "_asyncpg_conn", conn)
    return await trio_asyncio.aio_as_trio(unit)(raw, *args)  # type: ignore[no-any-return]
