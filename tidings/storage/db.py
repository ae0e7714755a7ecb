"""The connection pool, the types storage code is written against, and the
embedded PostgreSQL used when no DATABASE_URL is set.

Connections come in two kinds, one per side of the trio/asyncio bridge:

- ``TrioConnection``: what ``Database.acquire()`` and ``Database.transaction()``
  give trio code (a triopg proxy). Each await on it crosses to asyncio and back.
- ``AsyncioConnection``: what ``Database.run(unit, ...)`` gives ``unit``, which
  runs whole on the asyncio side (a plain asyncpg connection), in one crossing.
  Those units run on an asyncio loop in a thread of its own
  (``tidings.loop_thread``), with a pool of their own; trio-asyncio's
  loop, inside trio, serves the triopg proxies.

Storage functions are written against ``Connection``, which both are, so they
run on either side. **Which functions may run on the asyncio side** (be
passed to ``Database.run``): every function of a ``tidings.storage`` module
that takes a ``Connection`` first, and any function elsewhere whose first
parameter is typed ``AsyncioConnection``. Such a function awaits nothing but
its connection and other such functions: it must not touch trio, whose
primitives on the asyncio side fail or, worse, act on the trio task that runs
the asyncio loop. Three things hold that line:

- types: ``Database.run`` takes only units whose first parameter accepts an
  ``AsyncioConnection``, and trio code has none to give (a ``TrioConnection``
  is not one), so a unit written for trio code does not type-check;
- a test (tests/storage/test_sides.py) reads every such function and fails if
  it names anything from trio, trio_asyncio, triopg or anyio, and fails if a
  ``tidings.storage`` module other than this one imports them;
- at run time ``Database.run`` refuses a unit that is neither (``WrongSide``),
  and a unit that reaches for the pool from the asyncio side is refused too.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar, cast
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import trio
import trio_asyncio
import triopg

from tidings.config import Config
from tidings.loop_thread import LoopThread
from tidings.storage.connection import (
    AsyncioConnection,
    Connection,
    Json,
    PreparedStatement,
    Row,
    TrioConnection,
    returned,
)
from tidings.storage.embedded import keep_embedded_running, start_embedded
from tidings.storage.migrate import migrate

__all__ = [
    "AsyncioConnection",
    "Connection",
    "Database",
    "Json",
    "PreparedStatement",
    "Row",
    "TrioConnection",
    "WrongSide",
    "open_database",
    "UnitPool",
    "open_unit_pool",
    "returned",
]

log = logging.getLogger("tidings.storage")

EMBEDDED_DATABASE = "tidings"
# How long the units' pool waits at shutdown for connections still out.
POOL_CLOSE_SECONDS = 10.0
# Every pooled connection's session: PostgreSQL ends one that sits in a
# transaction doing nothing for a minute, and with it the transaction and its
# locks. Tidings never waits on anything but PostgreSQL inside a transaction,
# so only a process that stopped running (SIGSTOP, a paused VM, a partition
# that TCP has not noticed) trips it: without it, the rows that process had
# locked (a broadcast's, a chunk's, an email's) would stay locked, and the
# work they stand for stuck, for as long as its connection lives.
SESSION_SETTINGS = {"idle_in_transaction_session_timeout": "60s"}

T = TypeVar("T")
P = ParamSpec("P")


class WrongSide(RuntimeError):
    """Storage work handed to the side of the bridge it may not run on."""


# Set while a unit runs on the asyncio side: it must not reach back for the pool.
_on_asyncio_side: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "tidings_on_asyncio_side", default=False
)
_ALLOWED: dict[Callable[..., object], bool] = {}
_TRIO_MODULES = ("trio", "trio_asyncio", "triopg", "anyio")


def may_run_on_asyncio(unit: Callable[..., object]) -> bool:
    """Whether ``unit`` is one the module docstring allows on the asyncio side."""
    known = _ALLOWED.get(unit)
    if known is None:
        known = _ALLOWED[unit] = _declared_for_asyncio(unit)
    return known


def _declared_for_asyncio(unit: Callable[..., object]) -> bool:
    module = getattr(unit, "__module__", None) or ""
    if module.startswith("tidings.storage.") and module != __name__:
        return True
    try:
        first = next(iter(inspect.signature(unit).parameters.values()), None)
    except (TypeError, ValueError):
        return False
    if first is None:
        return False
    annotation = first.annotation
    name = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    return name.rpartition(".")[2] == "AsyncioConnection"


def _check_unit(unit: Callable[..., object]) -> None:
    if not may_run_on_asyncio(unit):
        raise WrongSide(
            f"{getattr(unit, '__qualname__', unit)!r} may not run on the asyncio side: "
            "only functions of tidings.storage and functions whose first parameter "
            "is an AsyncioConnection may"
        )


def _not_on_asyncio_side(what: str) -> None:
    if _on_asyncio_side.get():
        raise WrongSide(
            f"{what} from inside Database.run: a unit on the asyncio side uses the "
            "connection it was given, and nothing of trio"
        )


async def _keep_session(conn: Any) -> None:
    """Pool connections go back without asyncpg's reset query (one round trip
    saved per request). Nothing in Tidings leaves session state behind on a
    pooled connection: LISTEN uses connections of its own, and advisory
    locks are released where they are taken."""


class Database:
    """The pool of one service process."""

    def __init__(self, pool: Any, units: UnitPool, url: str) -> None:
        self._pool = pool  # triopg's, for trio code
        self._units = units  # for ``run``
        self.url = url

    async def run(
        self,
        unit: Callable[Concatenate[AsyncioConnection, P], Awaitable[T]],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """Run ``unit(conn, *args, **kwargs)`` on a pooled connection in one crossing
        to asyncio.

        Each await on a triopg connection crosses from trio to asyncio and
        back, which costs more CPU here than the query itself. A unit that
        only awaits its connection runs whole on the asyncio side instead:
        acquire, its queries, release, in one crossing to the storage loop's
        thread. Which units may: see the module docstring; any other is
        refused with ``WrongSide``. Cancellation while it runs cancels the
        asyncio task; the connection goes back to the pool.
        """
        _not_on_asyncio_side("Database.run")
        _check_unit(unit)
        result: T = await self._units.loop.run(self._run_on_asyncio, unit, args, kwargs)
        return result

    async def _run_on_asyncio(
        self,
        unit: Callable[..., Awaitable[T]],
        args: tuple[object, ...],
        kwargs: dict[str, object],
    ) -> T:
        # This runs in an asyncio task of its own: the mark stays inside it.
        _on_asyncio_side.set(True)
        async with self._units.pool.acquire() as conn:
            return await unit(conn, *args, **kwargs)

    def acquire(self) -> AbstractAsyncContextManager[TrioConnection]:
        """``async with db.acquire() as conn``: a connection from the pool."""
        _not_on_asyncio_side("Database.acquire")
        acquired: AbstractAsyncContextManager[TrioConnection] = self._pool.acquire()
        return acquired

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[TrioConnection]:
        """A connection inside a transaction, committed when the block ends."""
        _not_on_asyncio_side("Database.transaction")
        async with self._pool.acquire() as conn, conn.transaction():
            yield conn


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
    async with trio_asyncio.open_loop() as loop:
        loop.set_exception_handler(_log_unawaited)
        yield


def _log_unawaited(loop: object, context: dict[str, Any]) -> None:
    """What the asyncio side reports with no one to report it to: logged.

    trio-asyncio's own handler raises it into the loop's nursery, which ends
    the process. asyncpg leaves such errors behind when a server refuses it
    mid-handshake (a server in crash recovery answers "starting up" during
    its TLS negotiation): no request is waiting for them, and the next
    connection attempt succeeds or fails on its own.
    """
    error = context.get("exception")
    log.warning("storage: %s", context.get("message") or "unhandled error on the asyncio side",
                exc_info=error if isinstance(error, BaseException) else None)


# How often a process looks whether the embedded server still runs.
WATCH_SECONDS = 2.0


async def watch_embedded(data_dir: Path, every: float = WATCH_SECONDS) -> None:
    """Keep the embedded server of ``data_dir`` running while this process runs."""
    while True:
        await trio.sleep(every)
        await trio.to_thread.run_sync(keep_embedded_running, data_dir)


@asynccontextmanager
async def open_database(config: Config, *, run_migrations: bool = True) -> AsyncIterator[Database]:
    """Connect to the database (starting the embedded one if needed) and migrate it.

    Cancellation while opening leaves nothing behind but a possibly running
    embedded server, which the next start reuses.
    """
    async with open_asyncio_bridge(), trio.open_nursery() as nursery:
        url = await resolve_url(config)
        if config.database_url is None:
            nursery.start_soon(watch_embedded, config.data_dir)
        async with triopg.create_pool(
            url, min_size=1, max_size=config.db_pool_size, command_timeout=60,
            reset=_keep_session, server_settings=SESSION_SETTINGS,
        ) as pool:
            if run_migrations:
                async with pool.acquire() as conn:
                    applied = await migrate(conn)
                if applied:
                    log.info("applied migrations: %s", ", ".join(applied))
            async with open_unit_pool(url, config.db_pool_size) as units:
                yield Database(pool, units, url)
        nursery.cancel_scope.cancel()


@dataclass(frozen=True)
class UnitPool:
    """The connections ``Database.run`` gives units, and the loop they run on."""

    loop: LoopThread
    pool: asyncpg.Pool


@asynccontextmanager
async def open_unit_pool(url: str, size: int) -> AsyncIterator[UnitPool]:
    """A storage loop in a thread of its own with a pool of ``size``
    connections on it (the settings of the triopg pool); both closed after."""
    loop = await trio.to_thread.run_sync(LoopThread)
    try:
        pool = await loop.run(_create_pool, url, size)
        try:
            yield UnitPool(loop, pool)
        finally:
            with trio.CancelScope(shield=True):
                await loop.run(_close_pool, pool)
    finally:
        await trio.to_thread.run_sync(loop.close, abandon_on_cancel=False)


async def _create_pool(url: str, size: int) -> asyncpg.Pool:
    pool: asyncpg.Pool = await asyncpg.create_pool(
        url, min_size=1, max_size=size, command_timeout=60, reset=_keep_session,
        server_settings=SESSION_SETTINGS,
    )
    return pool


async def _close_pool(pool: asyncpg.Pool) -> None:
    try:
        await asyncio.wait_for(pool.close(), POOL_CLOSE_SECONDS)
    except TimeoutError:
        pool.terminate()


async def run_on(
    conn: object,
    unit: Callable[Concatenate[AsyncioConnection, P], Awaitable[T]],
    *args: P.args,
    **kwargs: P.kwargs,
) -> T:
    """Run ``unit(conn, *args, **kwargs)`` on a connection the caller holds, in
    one crossing.

    ``Database.run`` for a connection already taken (a request's, inside its
    transaction when it has one): the unit's queries run whole on the asyncio
    side, on the asyncpg connection behind the triopg proxy. The same units
    may run as with ``Database.run``; any other is refused with ``WrongSide``.
    """
    _not_on_asyncio_side("run_on")
    _check_unit(unit)
    # triopg's proxy wraps the asyncpg connection that the unit gets.
    raw = cast(AsyncioConnection, getattr(conn, "_asyncpg_conn", conn))

    async def marked() -> T:
        _on_asyncio_side.set(True)
        return await unit(raw, *args, **kwargs)

    result: T = await trio_asyncio.aio_as_trio(marked)()
    return result
