"""The keyed supervisor: starts actors on demand by key, restarts them, stops them.

An actor owns one entity (a webhook endpoint, a broadcast, an idempotency
shard). The supervisor keeps at most one running actor per key, each with a
bounded mailbox. It starts an actor when the first message for its key
arrives (or when asked to with :meth:`Supervisor.start`), restarts one that
crashed after its backoff (``policy.py``), gives one up when it crashes more
often than its intensity allows, and forgets one that stopped because it was
idle. The supervisor owns its nursery; nobody else spawns into it.

Work that is not keyed (a listener, a dispatcher, a sweeper) is a singleton
child instead (``singleton.py``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from contextlib import asynccontextmanager
from typing import Generic, TypeVar

import trio

from tidings.actors.mailbox import (
    ActorStopped,
    Mailbox,
    MailboxFull,
    Reply,
    open_reply,
    wait_reply,
)
from tidings.actors.policy import (
    DEFAULT_BACKOFF,
    Backoff,
    Intensity,
    Restarts,
    stopping_part,
)

log = logging.getLogger("tidings.actors")

K = TypeVar("K", bound=Hashable)
K_contra = TypeVar("K_contra", bound=Hashable, contravariant=True)
M = TypeVar("M")
T = TypeVar("T")


class Actor(Generic[M]):
    """Base class of actors.

    The default :meth:`run` handles one message at a time until the mailbox
    says stop (idle for ``idle_timeout`` seconds, or shutdown). Actors that
    own background loops override :meth:`run` and open their own nursery
    there. An exception escaping :meth:`run` is a crash: the supervisor logs
    it and starts a fresh instance after a backoff.
    """

    idle_timeout: float | None = 60.0

    async def run(self, mailbox: Mailbox[M]) -> None:
        async for message in mailbox:
            await self.handle(message)

    async def handle(self, message: M) -> None:
        raise NotImplementedError


class _Entry(Generic[M]):
    __slots__ = ("send", "mailbox", "sleep_scope")

    def __init__(
        self, send: trio.MemorySendChannel[M], mailbox: Mailbox[M]
    ) -> None:
        self.send = send
        self.mailbox = mailbox
        self.sleep_scope: trio.CancelScope | None = None


class Handle(Generic[M]):
    """How everyone else talks to the actor of one key.

    A handle stays valid across restarts and idle stops: each send finds (or
    starts) the live actor for its key.
    """

    __slots__ = ("_supervisor", "key")

    def __init__(self, supervisor: Supervisor[K, M], key: K) -> None:
        self._supervisor: Supervisor[Hashable, M] = supervisor  # type: ignore[assignment]
        self.key = key

    async def send(self, message: M) -> None:
        """Put a message in the mailbox, waiting while it is full.

        Raises ActorStopped if the supervisor is shutting down. Cancelled while
        waiting, the message was not delivered.
        """
        entry = self._supervisor._ensure(self.key)
        try:
            await entry.send.send(message)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise ActorStopped(f"{self._supervisor.name}[{self.key!r}] stopped") from None

    def try_send(self, message: M) -> None:
        """Put a message in the mailbox now, or raise MailboxFull."""
        entry = self._supervisor._ensure(self.key)
        try:
            entry.send.send_nowait(message)
        except trio.WouldBlock:
            raise MailboxFull(f"{self._supervisor.name}[{self.key!r}] mailbox is full") from None
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise ActorStopped(f"{self._supervisor.name}[{self.key!r}] stopped") from None

    async def ask(self, make: Callable[[Reply[T]], M]) -> T:
        """Send a request built by ``make(reply)`` and wait for its answer.

        Takes no timeout: wrap the call in ``trio.fail_after``. A caller that
        gives up leaves the actor unharmed; its answer is dropped. Raises
        ActorStopped if the actor ended (crashed or stopped) before answering.
        """
        reply: Reply[T]
        receive: trio.MemoryReceiveChannel[T]
        reply, receive = open_reply()
        try:
            await self.send(make(reply))
        except BaseException:
            receive.close()
            raise
        return await wait_reply(receive)


GiveUp = Callable[[K_contra, Exception], Awaitable[None]]


class Supervisor(Generic[K, M]):
    """Runs at most one actor per key. Create with :func:`open_supervisor`
    or ``Runtime.keyed``.

    Each key has its own crash record: its backoff grows with its own
    crashes, and with an ``intensity`` a key that crashes too often is given
    up: its callers get ActorStopped, ``on_give_up(key, error)`` runs, and
    the key is forgotten. A later message for it starts a fresh actor with a
    clean record, so the hook should leave the entity where nobody wakes it
    again (a broadcast marked ``failed``).
    """

    def __init__(
        self,
        name: str,
        factory: Callable[[K], Actor[M]],
        nursery: trio.Nursery,
        *,
        mailbox_size: int,
        backoff: Backoff,
        intensity: Intensity | None = None,
        on_give_up: GiveUp[K] | None = None,
    ) -> None:
        if mailbox_size < 1:
            raise ValueError("mailbox_size must be at least 1")
        self.name = name
        self._factory = factory
        self._nursery = nursery
        self._mailbox_size = mailbox_size
        self._backoff = backoff
        self._intensity = intensity
        self._on_give_up = on_give_up
        self._entries: dict[K, _Entry[M]] = {}
        self._stopping = False
        self.restarts = 0
        self.given_up = 0

    def handle(self, key: K) -> Handle[M]:
        return Handle(self, key)

    def start(self, key: K) -> None:
        """Start the actor of ``key`` now if it is not running."""
        self._ensure(key)

    def running(self) -> list[K]:
        return list(self._entries)

    def queued(self) -> int:
        """Messages waiting in all mailboxes."""
        return sum(entry.mailbox.pending() for entry in self._entries.values())

    def is_running(self, key: K) -> bool:
        return key in self._entries

    def stop(self) -> None:
        """Ask every actor to stop after its current message; refuse new ones."""
        self._stopping = True
        for entry in self._entries.values():
            entry.mailbox.request_stop()
            if entry.sleep_scope is not None:
                entry.sleep_scope.cancel()

    def _ensure(self, key: K) -> _Entry[M]:
        entry = self._entries.get(key)
        if entry is not None:
            return entry
        if self._stopping:
            raise ActorStopped(f"{self.name} is shutting down")
        send, receive = trio.open_memory_channel[M](self._mailbox_size)
        entry = _Entry(send, Mailbox(receive, idle_timeout=None))
        self._entries[key] = entry
        self._nursery.start_soon(self._supervise, key, entry, name=f"{self.name}[{key!r}]")
        return entry

    async def _supervise(self, key: K, entry: _Entry[M]) -> None:
        restarts = Restarts(self._backoff, self._intensity)
        mailbox = entry.mailbox
        try:
            while not mailbox.stopping:
                started = trio.current_time()
                try:
                    # A factory that fails counts as a crash of the actor.
                    actor = self._factory(key)
                    mailbox.idle_timeout = actor.idle_timeout
                    await actor.run(mailbox)
                except Exception as crash:
                    mailbox.finish_current()
                    delay = restarts.crashed(started, trio.current_time(), crash)
                    if delay is None:
                        await self._give_up(key, entry, crash)
                        return
                    self.restarts += 1
                    restarts.log(f"actor {self.name}[{key!r}]", crash, delay)
                    with trio.CancelScope() as entry.sleep_scope:
                        if not mailbox.stopping:
                            await trio.sleep(delay)
                    entry.sleep_scope = None
                    continue
                except BaseExceptionGroup as stopped:
                    raise stopping_part(stopped, f"actor {self.name}[{key!r}]") from None
                mailbox.finish_current()
                # Ended by itself or idle. Messages that arrived meanwhile still
                # need it; otherwise it is done. No checkpoint between this test
                # and the removal below, so no message can slip in unseen.
                if mailbox.pending() == 0:
                    break
        finally:
            del self._entries[key]
            entry.send.close()
            # Cancelled mid-message (a shutdown cut short): its caller must not hang.
            mailbox.finish_current()
            mailbox.drain_unanswered()

    async def _give_up(self, key: K, entry: _Entry[M], crash: Exception) -> None:
        self.given_up += 1
        log.error(
            "actor %s[%r] crashed more than its intensity allows; giving up",
            self.name, key, exc_info=crash,
        )
        # Nothing queued will be handled: release those callers before the hook runs.
        entry.mailbox.drain_unanswered()
        if self._on_give_up is not None:
            try:
                await self._on_give_up(key, crash)
            except Exception:
                log.exception("the give-up hook of %s[%r] failed", self.name, key)


@asynccontextmanager
async def open_supervisor(
    name: str,
    factory: Callable[[K], Actor[M]],
    *,
    mailbox_size: int = 64,
    backoff: Backoff = DEFAULT_BACKOFF,
    intensity: Intensity | None = None,
    on_give_up: GiveUp[K] | None = None,
) -> AsyncIterator[Supervisor[K, M]]:
    """Run a supervisor for the duration of the block.

    Leaving the block asks every actor to finish its current message and
    stop, and waits for them; callers bound that wait with a cancel scope.
    """
    async with trio.open_nursery() as nursery:
        supervisor: Supervisor[K, M] = Supervisor(
            name, factory, nursery, mailbox_size=mailbox_size, backoff=backoff,
            intensity=intensity, on_give_up=on_give_up,
        )
        try:
            yield supervisor
        finally:
            supervisor.stop()
