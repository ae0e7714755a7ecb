"""The asyncio loop that storage units run on: a loop of its own, in a thread.

``Database.run`` hands a unit to this loop with ``call_soon_threadsafe`` and
the calling trio task sleeps until the loop's thread hands the outcome back
through the trio token. A unit's round trips to PostgreSQL then run on a
plain asyncio loop (uvloop where it is installed), where asyncpg is at home:
each reply costs a callback or two of that loop. On trio-asyncio's loop,
which runs inside trio, every asyncio callback is a trio checkpoint of its
own, and a request paid about a fifth of its CPU for them
(``docs/benchmarks.md``, "The storage bridge").

Cancellation of the trio caller cancels the asyncio task and waits for it to
end (its transaction rolled back, its connection back in the pool); if the
unit finished first, its result stands and the cancellation is raised at the
caller's next checkpoint.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import outcome
import sniffio
import trio

T = TypeVar("T")


def _new_loop() -> asyncio.AbstractEventLoop:
    # Made in the loop's own thread: in trio's, trio-asyncio's event loop
    # policy refuses to make one.
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency where it builds
        return asyncio.SelectorEventLoop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


async def _awaited(function: Callable[..., Awaitable[T]], args: tuple[Any, ...]) -> T:
    return await function(*args)


class LoopThread:
    """A running asyncio loop in a thread of its own; ``close`` stops it."""

    loop: asyncio.AbstractEventLoop

    def __init__(self, name: str = "tidings-storage") -> None:
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()

    def _main(self) -> None:
        self.loop = _new_loop()
        self.loop.call_soon(self._ready.set)
        try:
            self.loop.run_forever()
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    async def run(self, function: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await function(*args)`` on the loop, from a trio task, with the
        task's context variables (a copy: what the function sets stays there)."""
        task = trio.lowlevel.current_task()
        token = trio.lowlevel.current_trio_token()
        context = contextvars.copy_context()
        context.run(sniffio.current_async_library_cvar.set, "asyncio")
        running: list[asyncio.Task[T]] = []
        cancel_requested = False

        def done(future: asyncio.Task[T]) -> None:
            result: outcome.Outcome[T]
            if future.cancelled():
                result = outcome.Error(asyncio.CancelledError())
            elif (error := future.exception()) is not None:
                result = outcome.Error(error)
            else:
                result = outcome.Value(future.result())
            token.run_sync_soon(trio.lowlevel.reschedule, task, result)

        def start() -> None:
            future: asyncio.Task[T] = self.loop.create_task(
                _awaited(function, args), context=context
            )
            running.append(future)
            future.add_done_callback(done)

        def cancel() -> None:
            if running:  # ``start`` ran first: the loop runs callbacks in order
                running[0].cancel()

        def abort(_: object) -> trio.lowlevel.Abort:
            nonlocal cancel_requested
            cancel_requested = True
            self.loop.call_soon_threadsafe(cancel)
            return trio.lowlevel.Abort.FAILED  # ``done`` wakes the task all the same

        self.loop.call_soon_threadsafe(start)
        try:
            value: T = await trio.lowlevel.wait_task_rescheduled(abort)
        except asyncio.CancelledError:
            if not cancel_requested:
                raise
            await trio.lowlevel.checkpoint()  # raises the trio cancellation
            raise
        return value

    def close(self) -> None:
        """Stop the loop and wait for its thread (blocking)."""
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
