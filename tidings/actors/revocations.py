"""The singleton that keeps the token cache honest: it LISTENs for revocations.

While it is connected the cache may answer; when the connection ends (as
asyncpg learns at once when the server closes it) or fails a ping, it
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
            ended = trio.Event()
            conn.add_termination_listener(lambda _conn: self._ended(ended))
            async with conn.listen(REVOKED_CHANNEL, max_buffer_size=1024) as revoked:
                self._cache.clear()
                self._cache.live = True
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._ping, conn)
                    nursery.start_soon(self._watch, ended)
                    async for payload in revoked:
                        if isinstance(payload, str):
                            self._cache.forget(UUID(payload))
                        else:  # the buffer overflowed: some were missed
                            self._cache.clear()

    def _ended(self, ended: trio.Event) -> None:
        """The connection is gone (the server restarted, say): NOTIFYs sent
        from now on would not reach this process, so the cache goes dark at
        once, not at the next ping."""
        self._cache.live = False
        self._cache.clear()
        ended.set()

    async def _watch(self, ended: trio.Event) -> None:
        await ended.wait()
        raise ConnectionError("the connection listening for revocations ended")

    async def _ping(self, conn: object) -> None:
        while True:
            await trio.sleep(PING_SECONDS)
            await conn.fetchval("SELECT 1")  # type: ignore[attr-defined]
