"""What storage modules see of a connection and its rows, typed.

A connection is a triopg proxy on the trio side and an asyncpg connection
inside ``Database.run``; neither is typed, so storage functions name the
methods they use (:class:`Queries`) and read rows as :class:`Row`. Rows
become domain objects with :func:`build`, the one place where a column's
value is trusted to have its dataclass field's type.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

D = TypeVar("D", bound="DataclassInstance")


class Row(Protocol):
    """A result row, read by column name."""

    def __getitem__(self, key: str, /) -> object: ...


class Queries(Protocol):
    """The query methods of a PostgreSQL connection (triopg or asyncpg)."""

    async def fetch(self, query: str, *args: object) -> Sequence[Row]: ...

    async def fetchrow(self, query: str, *args: object) -> Row | None: ...

    async def fetchval(self, query: str, *args: object) -> object: ...

    async def execute(self, query: str, *args: object) -> str: ...

    async def executemany(self, query: str, args: Sequence[Sequence[object]]) -> None: ...


def build(cls: type[D], row: Row, **given: object) -> D:
    """The dataclass ``cls`` from the columns of ``row`` named like its fields.

    Fields passed in ``given`` are not read from the row.
    """
    values = {
        field.name: row[field.name] for field in fields(cls) if field.name not in given
    }
    return cls(**values, **given)
