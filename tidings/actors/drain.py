"""An actor that records due rows as they fall due, in batches, for any owner.

For work every process may do for any team (a provider's announced
statuses, replies): ``record(conn, limit)`` takes up to ``limit`` due rows
in one transaction (``FOR UPDATE SKIP LOCKED``, so processes never take the
same row) and returns how many it recorded and the seconds until the next
row falls due. The actor runs it again at once after a full batch, else
sleeps until the next row or a wake, and stops after ``idle_seconds`` with
nothing scheduled.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from tidings.actors.duework import Wake
from tidings.actors.mailbox import Mailbox
from tidings.actors.supervisor import Actor
from tidings.storage.connection import AsyncioConnection
from tidings.storage.db import Database

Record = Callable[[AsyncioConnection, int], Awaitable[tuple[int, float | None]]]


class Drain(Actor[Wake]):
    """Records due rows with ``record``; sleeps until the next one or a wake."""

    idle_timeout = None

    def __init__(
        self, db: Database, record: Record, *, batch: int = 1000, idle_seconds: float = 30.0
    ) -> None:
        self._db = db
        self._record = record
        self._batch = batch
        self._idle_seconds = idle_seconds

    async def run(self, mailbox: Mailbox[Wake]) -> None:
        idle_deadline = trio.current_time() + self._idle_seconds
        while not mailbox.stopping:
            recorded, next_in = await self._db.run(self._record, self._batch)
            if recorded == self._batch:
                continue
            now = trio.current_time()
            if recorded or next_in is not None:
                idle_deadline = now + self._idle_seconds
            wait = max(next_in, 0.005) if next_in is not None else idle_deadline - now
            if wait <= 0:
                return  # idle: nothing scheduled for a while
            mailbox.idle_timeout = wait
            await mailbox.next()
            mailbox.idle_timeout = None
