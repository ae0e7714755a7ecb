"""Helpers for the tests of group commit (``tidings.gathering``): a send held
in PostgreSQL by a table lock while others line up behind it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
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


@asynccontextmanager
async def locked(service: Service, table: str) -> AsyncIterator[tuple[trio.Nursery, Any]]:
    """A nursery for sends, and a connection whose transaction holds
    ``table`` locked against writes until the block ends; the nursery then
    waits for the sends."""
    async with trio.open_nursery() as nursery, service.db.acquire() as conn:
        async with conn.transaction():
            await conn.execute(f"LOCK TABLE {table} IN SHARE MODE")
            yield nursery, conn


async def held_in_line(service: Service, table: str, leader: Send, followers: list[Send]) -> None:
    """Start ``leader`` while ``table`` is locked, then ``followers`` once it
    waits; release the lock when they have had time to line up."""
    async with locked(service, table) as (nursery, _conn):
        nursery.start_soon(leader)
        await waiting_on_lock(service)
        for follower in followers:
            nursery.start_soon(follower)
        await trio.sleep(0.5)


def poster(
    client: httpx.AsyncClient, path: str, body: Callable[..., dict[str, Any]],
    answers: dict[int, httpx.Response],
) -> Callable[..., Send]:
    """``post(n, **fields)``: a send of ``body(n, **fields)`` to ``path``,
    its answer kept as ``answers[n]``."""
    def post(number: int, **fields: Any) -> Send:
        async def run() -> None:
            answers[number] = await client.post(path, json=body(number, **fields))
        return run
    return post
