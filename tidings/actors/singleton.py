"""Singleton children: one long-running task of its own kind, supervised.

The revocation listener, the due-work dispatchers and the retention sweeper
own no entity and take no messages: each is one task per process, started
with the runtime. A singleton is an async function run to completion; a
fresh call after a crash is a fresh instance. It restarts on the same
policies as a keyed actor (``policy.py``): backoff, and with an intensity a
give-up that calls ``on_give_up(error)``.

A singleton is stopped by cancellation, so whatever it is doing when the
service stops must be safe to cut short (a LISTEN, a poll, a batch of a
sweep that the next run repeats).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from tidings.actors.policy import (
    DEFAULT_BACKOFF,
    Backoff,
    Intensity,
    Restarts,
    stopping_part,
)

log = logging.getLogger("tidings.actors")

SingletonGiveUp = Callable[[Exception], Awaitable[None]]


class Singleton:
    """One supervised task. Create with ``Runtime.singleton`` or :meth:`start`."""

    def __init__(
        self,
        name: str,
        run: Callable[[], Awaitable[None]],
        *,
        backoff: Backoff = DEFAULT_BACKOFF,
        intensity: Intensity | None = None,
        on_give_up: SingletonGiveUp | None = None,
    ) -> None:
        self.name = name
        self._run = run
        self._backoff = backoff
        self._intensity = intensity
        self._on_give_up = on_give_up
        self._scope = trio.CancelScope()
        self._running = False
        self.starts = 0
        self.restarts = 0
        self.given_up = 0

    def start(self, nursery: trio.Nursery) -> None:
        nursery.start_soon(self._supervise, name=self.name)

    def stop(self) -> None:
        """Cancel the task (and a restart it waits for)."""
        self._scope.cancel()

    def running(self) -> list[str]:
        return [self.name] if self._running else []

    def queued(self) -> int:
        return 0

    async def _supervise(self) -> None:
        restarts = Restarts(self._backoff, self._intensity)
        with self._scope:
            while True:
                started = trio.current_time()
                self.starts += 1
                self._running = True
                try:
                    await self._run()
                except Exception as crash:
                    self._running = False
                    delay = restarts.crashed(started, trio.current_time(), crash)
                    if delay is None:
                        await self._give_up(crash)
                        return
                    self.restarts += 1
                    restarts.log(self.name, crash, delay)
                    await trio.sleep(delay)
                    continue
                except BaseExceptionGroup as stopped:
                    raise stopping_part(stopped, self.name) from None
                finally:
                    self._running = False
                log.info("%s ended", self.name)
                return

    async def _give_up(self, crash: Exception) -> None:
        self.given_up += 1
        log.error(
            "%s crashed more than its intensity allows; giving up", self.name, exc_info=crash
        )
        if self._on_give_up is not None:
            try:
                await self._on_give_up(crash)
            except Exception:
                log.exception("the give-up hook of %s failed", self.name)
