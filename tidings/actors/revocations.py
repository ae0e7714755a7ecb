"""The actor that keeps the token cache honest: it LISTENs for revocations.

While it is connected the cache may answer; when the connection fails it
crashes, the cache goes dark and empty, and the supervisor reconnects it
after a backoff.
"""

from __future__ import annotations

import logging
import math
from uuid import UUID

import trio
import triopg

from tidings.actors.mailbox import Mailbox
from tidings.actors.supervisor import Actor
from tidings.auth import TokenCache
from tidings.storage.tokens import REVOKED_CHANNEL

log = logging.getLogger("tidings.auth")

# How often the listening connection is checked for life.
PING_SECONDS = 10.0


class RevocationListener(Actor[None]):
    idle_timeout = None

    def __init__(self, url: str, cache: TokenCache) -> None:
        self._url = url
        self._cache = cache

    async def run(self, mailbox: Mailbox[None]) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._listen)
                await mailbox.sleep(math.inf)  # until the supervisor says stop
                nursery.cancel_scope.cancel()
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
