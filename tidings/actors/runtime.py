"""The runtime of one process: every supervised child, in one nursery.

``open_runtime`` gives a :class:`Runtime` on which each group registers its
children (``tidings/service.py`` does it in one place):

* ``runtime.singleton(name, run)``: one task of its own kind (a listener, a
  sweeper), restarted on its policy;
* ``runtime.keyed(name, factory)``: actors started on demand by key (the
  idempotency shards);
* ``runtime.due(DueWork(...))``: durable due work: its dispatcher (a
  singleton) and its owner actors (keyed), see ``duework.py``.

Leaving the block stops them all: keyed actors finish their current message,
singletons are cancelled. The runtime owns its nursery; children are
started only through these methods.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Sequence
from contextlib import asynccontextmanager
from typing import Protocol, TypeVar

import trio

from tidings.actors.duework import Dispatcher, Due, DueWork, Listen, Wake, open_listener
from tidings.actors.policy import DEFAULT_BACKOFF, Backoff, Intensity
from tidings.actors.singleton import Singleton, SingletonGiveUp
from tidings.actors.supervisor import Actor, GiveUp, Supervisor
from tidings.storage.db import Database

K = TypeVar("K", bound=Hashable)
M = TypeVar("M")


class Supervised(Protocol):
    """What metrics read of a supervised child or group of children."""

    @property
    def name(self) -> str: ...

    @property
    def restarts(self) -> int: ...

    @property
    def given_up(self) -> int: ...

    def running(self) -> Sequence[object]: ...

    def queued(self) -> int: ...


class Runtime:
    """The supervised children of one process. Create with :func:`open_runtime`."""

    def __init__(self, db: Database, nursery: trio.Nursery, listen: Listen) -> None:
        self._db = db
        self._nursery = nursery
        self._listen = listen
        self._stops: list[Callable[[], None]] = []
        self._children: list[Supervised] = []

    def singleton(
        self,
        name: str,
        run: Callable[[], Awaitable[None]],
        *,
        backoff: Backoff = DEFAULT_BACKOFF,
        intensity: Intensity | None = None,
        on_give_up: SingletonGiveUp | None = None,
    ) -> Singleton:
        """Start ``run()`` as a singleton child; a crash calls it afresh."""
        child = Singleton(name, run, backoff=backoff, intensity=intensity, on_give_up=on_give_up)
        self._stops.append(child.stop)
        self._children.append(child)
        child.start(self._nursery)
        return child

    def keyed(
        self,
        name: str,
        factory: Callable[[K], Actor[M]],
        *,
        mailbox_size: int = 64,
        backoff: Backoff = DEFAULT_BACKOFF,
        intensity: Intensity | None = None,
        on_give_up: GiveUp[K] | None = None,
    ) -> Supervisor[K, M]:
        """A supervisor of actors by key, running in the runtime's nursery."""
        supervisor: Supervisor[K, M] = Supervisor(
            name, factory, self._nursery, mailbox_size=mailbox_size, backoff=backoff,
            intensity=intensity, on_give_up=on_give_up,
        )
        self._stops.append(supervisor.stop)
        self._children.append(supervisor)
        return supervisor

    def due(self, work: DueWork[K]) -> Due[K]:
        """Run ``work``: its owner actors, and its dispatcher as a singleton."""
        owners: Supervisor[K, Wake] = self.keyed(
            work.name, work.actor, mailbox_size=1, backoff=work.backoff,
            intensity=work.intensity, on_give_up=work.on_give_up,
        )
        due = Due(work, owners)
        db, listen = self._db, self._listen
        self.singleton(
            f"{work.name}-dispatcher", lambda: Dispatcher(db, due, listen).run()
        )
        return due

    def children(self) -> list[Supervised]:
        return list(self._children)

    def stop(self) -> None:
        """Cancel the singletons; ask keyed actors to finish their message and stop."""
        for stop in self._stops:
            stop()


@asynccontextmanager
async def open_runtime(db: Database, *, listen: Listen = open_listener) -> AsyncIterator[Runtime]:
    """Run the children registered on the runtime for the duration of the block.

    Leaving the block stops them and waits; callers bound that wait with a
    cancel scope. ``listen`` opens the LISTEN connections of the dispatchers.
    """
    async with trio.open_nursery() as nursery:
        runtime = Runtime(db, nursery, listen)
        try:
            yield runtime
        finally:
            runtime.stop()
