"""The singleton that keeps the token cache honest: it LISTENs for revocations.

While it is connected the cache may answer; when the connection fails it
crashes, the cache goes dark and empty, and the runtime reconnects it after
a backoff.
"""

from __future__ import annotations

import logging
from uuid import UUID

import trio
import triopg

from tidings.auth import TokenCache
from tidings.storage.tokens import REVOKED_CHANNEL

log = logging.getLogger("tidings.auth")

# How often the listening connection is checked for life.
PING_SECONDS = 10.0


class RevocationListener:
    def __init__(self, url: str, cache: TokenCache) -> None:
        self._url = url
        self._cache = cache

    async def run(self) -> None:
        """Listen until cancelled or the connection fails; the cache is dark after."""
        try:
            await self._listen()
        finally:
            self._cache.live = False
            self._cache.clear()

    async def _listen(self) -> None:
        async with triopg.connect(self._url) as conn:
            async with conn.listen(REVOKED_CHANNEL, max_buffer_size=1024) as revoked:
                self._cache.clear()
                self._cache.live = True
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._ping, conn)
                    async for payload in revoked:
                        if isinstance(payload, str):
                            self._cache.forget(UUID(payload))
                        else:  # the buffer overflowed: some were missed
                            self._cache.clear()

    async def _ping(self, conn: object) -> None:
        while True:
            await trio.sleep(PING_SECONDS)
            await conn.fetchval("SELECT 1")  # type: ignore[attr-defined]
