"""The types storage code is written against: a connection, a row, JSON.

Only types: no driver, no trio. ``tidings.storage.db`` explains the two
kinds of connection and which functions may run on the asyncio side, and
exports these names too.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

# A value as JSON holds it (json.loads gives one, json.dumps takes one).
Json = dict[str, "Json"] | list["Json"] | str | int | float | bool | None


class Row(Protocol):
    """A result row (an asyncpg ``Record``), read by column name."""

    def __getitem__(self, key: str, /) -> Any: ...

    def keys(self) -> Iterable[str]: ...

    def get(self, key: str, default: Any = None, /) -> Any: ...


class PreparedStatement(Protocol):
    async def fetchrow(self, *args: object) -> Row | None: ...


class Connection(Protocol):
    """The methods storage code uses, which connections of both sides have."""

    async def fetch(self, query: str, *args: object) -> list[Row]: ...

    async def fetchrow(self, query: str, *args: object) -> Row | None: ...

    async def fetchval(self, query: str, *args: object) -> Any: ...

    async def execute(self, query: str, *args: object) -> str: ...

    async def executemany(self, command: str, args: Iterable[Sequence[object]]) -> None: ...

    async def prepare(self, query: str) -> PreparedStatement: ...

    def transaction(self) -> AbstractAsyncContextManager[object]: ...

    def is_in_transaction(self) -> bool: ...


class TrioConnection(Connection, Protocol):
    """A connection held by trio code: each await crosses to asyncio and back."""

    def listen(
        self, channel: str, *, max_buffer_size: int
    ) -> AbstractAsyncContextManager[AsyncIterable[object]]: ...


class AsyncioConnection(Connection, Protocol):
    """A connection on the asyncio side, only ever given out by ``Database.run``."""

    def add_listener(self, channel: str, callback: Callable[..., object]) -> Awaitable[None]: ...


def returned(row: Row | None) -> Row:
    """The row of a statement that always returns one (``INSERT ... RETURNING``)."""
    if row is None:
        raise RuntimeError("the statement returned no row")
    return row
