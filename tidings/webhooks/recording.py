"""Writing the finished attempts of every endpoint actor of a process, in batches."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import trio

from tidings.storage import webhook_delivery as store

# A finished attempt, ready to record.
Recorded = tuple[store.Claimed, store.Outcome]
# The longest one batch of attempts may take to write. Generous: a batch that
# times out is handed back, and its deliveries are sent again.
RECORD_SECONDS = 60.0


class RecordFailed(Exception):
    """A batch of attempts could not be written (see the cause)."""


class _Gathering:
    def __init__(self) -> None:
        self.items: list[Recorded] = []
        self.done = trio.Event()
        self.error: BaseException | None = None


class SharedRecorder:
    """Writes the finished attempts of every endpoint actor of a process, together.

    One batch is written at a time, in one statement; the attempts that
    finish meanwhile, whichever endpoint they went to, gather and go in the
    next batch. So the batches grow with the rate of deliveries, not with one
    endpoint's. :meth:`record` returns once its attempts are written (raises
    RecordFailed if that failed), as a single actor's record would.
    """

    def __init__(self, write: Callable[[list[Recorded]], Awaitable[None]]) -> None:
        self._write = write
        self._gathering = _Gathering()
        self._writing = False
        self._written = trio.Event()
        self.batches = 0

    async def record(self, items: Sequence[Recorded]) -> None:
        gathering = self._gathering
        gathering.items.extend(items)
        try:
            while self._writing and not gathering.done.is_set():
                await self._written.wait()
        except BaseException:
            if gathering is self._gathering:  # not taken yet: take them back out
                for item in items:
                    gathering.items.remove(item)
            raise
        if not gathering.done.is_set():
            await self._write_batch(gathering)
        if gathering.error is not None:
            raise RecordFailed("the attempts were not recorded") from gathering.error

    async def _write_batch(self, gathering: _Gathering) -> None:
        self._gathering = _Gathering()
        self._writing = True
        self._written = trio.Event()
        try:
            # Other actors' attempts are in this batch: finish it even if this
            # actor is being stopped.
            with trio.CancelScope(shield=True), trio.fail_after(RECORD_SECONDS):
                await self._write(gathering.items)
            self.batches += 1
        except BaseException as error:
            gathering.error = error
        finally:
            gathering.done.set()
            self._writing = False
            self._written.set()

