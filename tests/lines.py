"""Helpers for the tests of group commit (``tidings.gathering``): a send held
in PostgreSQL by a table lock while others line up behind it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from tidings.service import Service

Send = Callable[[], Awaitable[None]]


async def waiting_on_lock(service: Service, count: int = 1) -> None:
    """Until ``count`` sessions wait for a lock (the test holds it)."""
    with trio.fail_after(10):
        while True:
            async with service.db.acquire() as conn:
                waiting = await conn.fetchval(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND datname = current_database()"
                )
            if waiting >= count:
                return
            await trio.sleep(0.02)


async def held_in_line(service: Service, table: str, leader: Send, followers: list[Send]) -> None:
    """Start ``leader`` while ``table`` is locked, then ``followers`` once it
    waits; release the lock when they have had time to line up."""
    async with trio.open_nursery() as nursery, service.db.acquire() as conn:
        async with conn.transaction():
            await conn.execute(f"LOCK TABLE {table} IN SHARE MODE")
            nursery.start_soon(leader)
            await waiting_on_lock(service)
            for follower in followers:
                nursery.start_soon(follower)
            await trio.sleep(0.5)
