"""Signing keys every process of a deployment shares, read once per process.

A key is derived from ``TIDINGS_SECRET_KEY`` when it is set (each kind with
its own purpose, in its ``derived``); else the first process that needs it
stores 32 random bytes in the database (``service_keys``, under the kind's
name) and every process reads those. The unsubscribe links and the bounce
addresses are signed so.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Generic, TypeVar

import trio

from tidings.storage.broadcasts_unsubscribe import service_key
from tidings.storage.db import Database

K = TypeVar("K")


class SharedKey(Generic[K]):
    """One kind of key: ``make`` wraps stored bytes, ``derive`` a secret key's."""

    def __init__(
        self, db: Database, secret_key: bytes | None, name: str,
        make: Callable[[bytes], K], derive: Callable[[bytes], K],
    ) -> None:
        self._db = db
        self._secret_key = secret_key
        self._name = name
        self._make = make
        self._derive = derive
        self._key: K | None = None
        self._lock = trio.Lock()

    async def get(self) -> K:
        if self._key is not None:
            return self._key
        async with self._lock:
            if self._key is None:
                if self._secret_key is not None:
                    self._key = self._derive(self._secret_key)
                else:
                    raw = await self._db.run(service_key, self._name, secrets.token_bytes(32))
                    self._key = self._make(raw)
            return self._key
