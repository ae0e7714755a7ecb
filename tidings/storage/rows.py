"""Rows become domain objects: :func:`build`, the one place where a column's
value is trusted to have its dataclass field's type.

``Queries`` and ``Row`` are the connection and row types of
:mod:`tidings.storage.connection`, under the names the webhook and lease
modules use.
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, TypeVar

from tidings.storage.connection import Connection as Queries
from tidings.storage.connection import Row

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["Queries", "Row", "build"]

D = TypeVar("D", bound="DataclassInstance")


def build(cls: type[D], row: Row, **given: object) -> D:
    """The dataclass ``cls`` from the columns of ``row`` named like its fields.

    Fields passed in ``given`` are not read from the row.
    """
    values = {
        field.name: row[field.name] for field in fields(cls) if field.name not in given
    }
    return cls(**values, **given)
