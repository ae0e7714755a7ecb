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
