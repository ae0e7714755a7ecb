"""The storage loop: units run on an asyncio loop in a thread of its own,
and a trio caller gets their outcome, their context and their cancellation."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Iterator
from contextvars import ContextVar

import pytest
import sniffio
import trio

from tidings.config import Config
from tidings.loop_thread import LoopThread
from tidings.storage.connection import AsyncioConnection
from tidings.storage.db import open_database

seen: ContextVar[str] = ContextVar("seen", default="unset")


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    running = LoopThread()
    try:
        yield running
    finally:
        running.close()


async def test_a_function_runs_on_the_loop_thread_and_its_value_comes_back(
    loop: LoopThread,
) -> None:
    async def where() -> tuple[int, str, bool]:
        await asyncio.sleep(0)
        running = asyncio.get_running_loop() is loop.loop
        return threading.get_ident(), sniffio.current_async_library(), running

    ident, library, on_loop = await loop.run(where)
    assert ident != threading.get_ident()
    assert (library, on_loop) == ("asyncio", True)


async def test_an_error_comes_back_as_itself(loop: LoopThread) -> None:
    async def fails() -> None:
        await asyncio.sleep(0)
        raise KeyError("missing")

    with pytest.raises(KeyError, match="missing"):
        await loop.run(fails)


async def test_the_callers_context_goes_in_and_nothing_comes_back(loop: LoopThread) -> None:
    async def reads_and_sets() -> str:
        before = seen.get()
        seen.set("set on the loop")
        return before

    seen.set("set by the caller")
    assert await loop.run(reads_and_sets) == "set by the caller"
    assert seen.get() == "set by the caller"


async def test_cancelling_the_caller_cancels_the_task_and_waits_for_its_end(
    loop: LoopThread,
) -> None:
    started, ended = threading.Event(), []

    async def slow() -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0.05)  # cleaning up takes a moment, as a rollback does
            ended.append(asyncio.current_task().cancelling())  # type: ignore[union-attr]

    with trio.move_on_after(0.2) as scope:
        await loop.run(slow)
    assert scope.cancelled_caught
    assert started.is_set()
    assert ended == [1], "the caller returned before the task had ended"


async def test_a_function_that_finishes_despite_the_cancel_keeps_its_value(
    loop: LoopThread,
) -> None:
    async def stubborn() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return "finished"
        return "slept"

    with trio.CancelScope() as scope:
        scope.cancel()
        value = await loop.run(stubborn)
        assert value == "finished"
        await trio.lowlevel.checkpoint()
    assert scope.cancelled_caught


async def test_a_cancelled_unit_rolls_back_and_gives_its_connection_back(
    config: Config,
) -> None:
    config = dataclasses.replace(config, db_pool_size=2)

    async def create(conn: AsyncioConnection) -> None:
        await conn.execute("CREATE TABLE IF NOT EXISTS loop_probe (n int)")

    async def write_then_hang(conn: AsyncioConnection) -> None:
        async with conn.transaction():
            await conn.execute("INSERT INTO loop_probe VALUES (1)")
            await asyncio.sleep(30)

    async def count(conn: AsyncioConnection) -> int:
        value: int = await conn.fetchval("SELECT count(*) FROM loop_probe")
        return value

    async with open_database(config) as db:
        await db.run(create)
        for _ in range(3):  # more cancellations than the pool has connections
            with trio.move_on_after(0.3) as scope:
                await db.run(write_then_hang)
            assert scope.cancelled_caught
        with trio.fail_after(10):
            assert await db.run(count) == 0
