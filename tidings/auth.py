"""Token lookups, cached in process memory and forgotten at once on revocation.

Each process LISTENs for revocations (a NOTIFY sent by the statement that
revokes) and drops the token from its cache. The cache answers only while
that listener is connected, and an entry lives at most ``ttl`` seconds, so a
lost notification cannot keep a revoked token alive for long.
"""

from __future__ import annotations

import time
from uuid import UUID

import trio

from tidings.storage.tokens import Token

DEFAULT_TTL_SECONDS = 60.0
MAX_ENTRIES = 10_000


class TokenCache:
    def __init__(self, ttl: float = DEFAULT_TTL_SECONDS, lookups: int = 1) -> None:
        self.ttl = ttl
        # Lookups of tokens the cache does not know, at once: at most this
        # many pooled connections, however many requests bring tokens that
        # are no tokens (each looked up, none cached) before their body.
        self.lookups = trio.CapacityLimiter(lookups)
        self.live = False
        # Moves on at every revocation: a lookup that began before one may
        # have read the token before it was revoked, so it is not cached.
        self.version = 0
        self._by_hash: dict[bytes, tuple[Token, float]] = {}
        self._hash_of: dict[UUID, bytes] = {}

    def get(self, secret_hash: bytes) -> Token | None:
        if not self.live:
            return None
        entry = self._by_hash.get(secret_hash)
        if entry is None:
            return None
        token, stored = entry
        if time.monotonic() - stored > self.ttl:
            self.forget(token.id)
            return None
        return token

    def put(self, secret_hash: bytes, token: Token, looked_up_at: int) -> None:
        """Cache a token read from storage while ``version`` was ``looked_up_at``."""
        if not self.live or not token.active or looked_up_at != self.version:
            return
        if len(self._by_hash) >= MAX_ENTRIES:
            self.clear()
        self._by_hash[secret_hash] = (token, time.monotonic())
        self._hash_of[token.id] = secret_hash

    def forget(self, token_id: UUID) -> None:
        self.version += 1
        secret_hash = self._hash_of.pop(token_id, None)
        if secret_hash is not None:
            self._by_hash.pop(secret_hash, None)

    def clear(self) -> None:
        self.version += 1
        self._by_hash.clear()
        self._hash_of.clear()
