"""Failures the storage layer reports in domain terms."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import asyncpg


class Duplicate(Exception):
    """A row with the same unique value exists already. HTTP answers 409,
    naming ``field``."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@contextmanager
def unique(field: str, message: str) -> Iterator[None]:
    """A unique violation inside the block becomes ``Duplicate(field, message)``."""
    try:
        yield
    except asyncpg.UniqueViolationError:
        raise Duplicate(field, message) from None


# What PostgreSQL or the network answers when storage is down, restarting or
# full of connections: the request may succeed if retried, so HTTP answers
# 503 (CONTRACT §2), not 500.
UNAVAILABLE = (
    OSError,  # refused, reset, the socket file gone
    asyncpg.PostgresConnectionError,  # class 08, the connection lost
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.CannotConnectNowError,  # starting up or shutting down
    asyncpg.TooManyConnectionsError,
)


def unavailable(error: BaseException) -> bool:
    """Whether ``error`` means storage cannot be reached now (see UNAVAILABLE)."""
    if isinstance(error, UNAVAILABLE):
        return True
    # asyncpg's own: a pooled connection whose server went away; or whose
    # server ended it while its holder waited (a send in a group's line, see
    # ``tidings.gathering``): asyncpg then detaches it from its holder.
    # Tidings never uses a connection it has given back to the pool.
    if isinstance(error, asyncpg.InterfaceError) and (
        "connection is closed" in str(error)
        or "connection has been released back to the pool" in str(error)
    ):
        return True
    # A query sent after the server's farewell (a FATAL for a connection it
    # ends, as on shutdown) had arrived but before the socket's end had:
    # asyncpg is still consuming that error (its state 2), not the query's.
    return isinstance(error, asyncpg.InternalClientError) and "operation (2)" in str(error)


def outage(error: BaseException) -> bool:
    """Whether ``error`` is storage unavailable: alone, as every error of a
    group (a task that failed with its siblings, all on the same outage), or
    as the cause of an error raised from it (a batch that was not recorded)."""
    if isinstance(error, BaseExceptionGroup):
        return all(outage(inner) for inner in error.exceptions)
    if error.__cause__ is not None and outage(error.__cause__):
        return True
    return unavailable(error)


# What PostgreSQL answers when it ends one of two transactions that wait for
# each other (a deadlock) or that it cannot order (a serialization failure):
# nothing was written, and the request may succeed if retried, so HTTP
# answers 503 with Retry-After, not 500.
CONTENDED = (asyncpg.DeadlockDetectedError, asyncpg.SerializationError)


def contended(error: BaseException) -> bool:
    """Whether ``error`` is a transaction PostgreSQL ended for another's sake."""
    return isinstance(error, CONTENDED)
