"""Durable due work: a dispatcher that wakes owner actors, and the owner actor.

Work that must happen at a time and survive a crash (a webhook delivery, an
email to send, a scheduled SMS, a broadcast's fan-out) lives in PostgreSQL
as leased rows (``tidings/storage/leases.py``), each belonging to an owner
key. A group describes its work once as a :class:`DueWork` and registers it
with ``Runtime.due``; the runtime then runs, per process:

* a dispatcher (a singleton child) that LISTENs on the work's channel,
  whose payload is an owner key, and polls the work's due query every
  ``poll_seconds`` for work nobody announced (retries that fell due, leases
  left by a process that died, notifications lost while it reconnected);
  either way it wakes the owner's actor;
* the owner actors, one per key with work, under a keyed supervisor with the
  work's restart policy.

An owner actor is usually a :class:`LeasedWorker` around the group's
:class:`Job`: claim due rows with a lease, perform each (at most
``concurrency`` at once), record the results in batches, sleep until the
next row falls due or a wake comes, stop when idle.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import trio
import triopg

from tidings.actors.handback import hand_back
from tidings.actors.mailbox import ActorStopped, Mailbox, MailboxFull
from tidings.actors.policy import DEFAULT_BACKOFF, Backoff, Intensity
from tidings.actors.supervisor import Actor, GiveUp, Supervisor
from tidings.storage.connection import AsyncioConnection
from tidings.storage.db import Database
from tidings.storage.errors import outage

log = logging.getLogger("tidings.actors")

# A hand-back is retried until this long before the rows' leases end.
LEASE_MARGIN = 1.0
# Once the actor is asked to stop, a claim under way is shielded from its
# cancellation for at most this long more: one that PostgreSQL holds longer
# (a lock another session holds) is cut short, its statement cancelled with
# nothing leased; so a shutdown keeps its deadline (grace + 5 s) however
# long the lock is held.
CLAIM_SHIELD_SECONDS = 4.0

K = TypeVar("K", bound=Hashable)
ItemT = TypeVar("ItemT")  # an item of work, as claimed
OutcomeT = TypeVar("OutcomeT")  # the outcome of performing it


@dataclass(frozen=True)
class Wake:
    """There may be work due for this owner."""


WAKE = Wake()

# (url, channel) -> the channel's payloads; None when some were lost.
Listen = Callable[[str, str], AbstractAsyncContextManager[AsyncIterator[str | None]]]


@asynccontextmanager
async def open_listener(url: str, channel: str) -> AsyncIterator[AsyncIterator[str | None]]:
    """LISTEN on ``channel`` over a connection of its own."""
    async with (
        triopg.connect(url) as conn,
        conn.listen(channel, max_buffer_size=10_000) as notifications,
    ):

        async def payloads() -> AsyncIterator[str | None]:
            async for payload in notifications:
                # Anything but a string says the buffer overflowed.
                yield payload if isinstance(payload, str) else None

        yield payloads()


@dataclass(frozen=True)
class DueWork(Generic[K]):
    """One kind of due work, as a group registers it.

    ``due(conn, limit)`` runs inside ``Database.run`` and returns up to
    ``limit`` owner keys with work due now that nobody holds. ``parse``
    turns a notification's payload into a key. ``actor(key)`` builds the
    owner's actor, which takes :class:`Wake` messages. The restart policy
    is per owner.
    """

    name: str
    channel: str
    due: Callable[[AsyncioConnection, int], Awaitable[Sequence[K]]]
    parse: Callable[[str], K]
    actor: Callable[[K], Actor[Wake]]
    poll_seconds: float = 1.0
    poll_batch: int = 1000
    backoff: Backoff = DEFAULT_BACKOFF
    intensity: Intensity | None = None
    on_give_up: GiveUp[K] | None = None


class Due(Generic[K]):
    """The handle of one registered due work: wake an owner, see its actors."""

    def __init__(self, work: DueWork[K], owners: Supervisor[K, Wake]) -> None:
        self.work = work
        self.owners = owners

    def wake(self, key: K) -> None:
        """Tell the owner's actor to look for due work (start it if needed)."""
        try:
            self.owners.handle(key).try_send(WAKE)
        except MailboxFull:
            pass  # a wake is already waiting
        except ActorStopped:
            pass  # shutting down


class Dispatcher(Generic[K]):
    """Wakes owner actors: on NOTIFY at once, and by polling as a safety net."""

    def __init__(self, db: Database, due: Due[K], listen: Listen) -> None:
        self._db = db
        self._due = due
        self._listen_on = listen
        self._poll_now = trio.Event()

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._listen)
            nursery.start_soon(self._poll)

    async def _listen(self) -> None:
        work = self._due.work
        async with self._listen_on(self._db.url, work.channel) as payloads:
            # Anything that fell due while nobody listened is found by a poll.
            self._poll_now.set()
            async for payload in payloads:
                if payload is None:
                    self._poll_now.set()
                    continue
                try:
                    key = work.parse(payload)
                except ValueError:
                    log.warning("%s: ignored a notification %r", work.name, payload)
                    continue
                self._due.wake(key)

    async def _poll(self) -> None:
        work = self._due.work
        while True:
            self._poll_now = trio.Event()
            for key in await self._db.run(work.due, work.poll_batch):
                self._due.wake(key)
            with trio.move_on_after(work.poll_seconds):
                await self._poll_now.wait()


@dataclass(frozen=True)
class Batch(Generic[ItemT]):
    """What one claim leased, and when the owner's next row falls due."""

    items: Sequence[ItemT]
    # Seconds until the earliest row not claimed falls due; None: none scheduled.
    next_due_in: float | None


class Job(Protocol[ItemT, OutcomeT]):
    """What an owner does with its leased rows; one instance per actor run."""

    @property
    def lease_seconds(self) -> float:
        """How long a claim leases its rows."""
        ...

    def open(self) -> AbstractAsyncContextManager[object]:
        """Resources the actor holds while it runs (a connection pool)."""
        ...

    async def claim(self, limit: int) -> Batch[ItemT]:
        """Lease up to ``limit`` due rows of the owner."""
        ...

    async def perform(self, item: ItemT) -> OutcomeT:
        """Do the work of one row. Expected failures are outcomes, not exceptions."""
        ...

    async def record(self, done: Sequence[tuple[ItemT, OutcomeT]]) -> None:
        """Record outcomes while holding their leases (one round trip for all)."""
        ...

    async def release(self, items: Sequence[ItemT]) -> None:
        """Hand leased rows back undone."""
        ...


class LeasedWorker(Actor[Wake], Generic[ItemT, OutcomeT]):
    """The actor of one owner: claims, performs and records its due rows.

    At most ``concurrency`` rows are performed at once, each in the actor's
    own nursery. Finished rows are recorded in batches: while one batch is
    written the next gathers, so a busy owner records many rows per round
    trip and an idle one waits for none. A row cut short (shutdown) is
    released at once rather than left for its lease to expire, and again
    while storage is down (``tidings.actors.handback``). With nothing
    in flight and nothing scheduled for ``idle_seconds`` the actor stops;
    the next wake starts it again.
    """

    # The actor decides itself when it is idle: not while work is in flight.
    idle_timeout = None

    def __init__(
        self, job: Job[ItemT, OutcomeT], *, concurrency: int, idle_seconds: float = 30.0
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self._job = job
        self._limit = concurrency
        self._idle_seconds = idle_seconds
        self._in_flight = 0
        self._poked = trio.Event()
        self._done: list[tuple[ItemT, OutcomeT]] = []
        self._to_record = trio.Event()
        self._closing = False
        self._stopping: Callable[[], bool] = lambda: True
        # Each row claimed and not yet recorded or handed back, with when its
        # lease ends at the earliest, on trio's clock (by object: rows need
        # not be hashable).
        self._ends: dict[int, tuple[ItemT, float]] = {}
        # The scope of a claim under way (see ``_loop``).
        self._claiming: trio.CancelScope | None = None
        # A row failed or was cut short: the actor is going down, so it
        # claims nothing more (a row it gives back is not taken again here).
        self._failing = False

    async def run(self, mailbox: Mailbox[Wake]) -> None:
        self._stopping = lambda: mailbox.stopping
        try:
            async with self._job.open(), trio.open_nursery() as nursery:
                listening = trio.CancelScope()
                nursery.start_soon(self._listen, mailbox, listening)
                nursery.start_soon(self._recorder)
                try:
                    await self._loop(nursery, mailbox)
                finally:
                    listening.cancel()
                    # Rows in flight finish and are recorded before the actor ends.
                    self._closing = True
                    self._to_record.set()
        finally:
            await self._settle()

    async def _listen(self, mailbox: Mailbox[Wake], scope: trio.CancelScope) -> None:
        with scope:
            async for _wake in mailbox:
                self._poked.set()
        self._poked.set()  # asked to stop
        if self._claiming is not None:
            self._claiming.deadline = min(
                self._claiming.deadline, trio.current_time() + CLAIM_SHIELD_SECONDS
            )

    async def _loop(self, nursery: trio.Nursery, mailbox: Mailbox[Wake]) -> None:
        idle_deadline = trio.current_time() + self._idle_seconds
        while not mailbox.stopping and not self._failing:
            self._poked = trio.Event()
            deadline = math.inf
            free = self._limit - self._in_flight
            if free > 0:
                # Shielded: a claim cut short on the trio side may still take
                # its leases in PostgreSQL. Finished, its rows are given back
                # at once if the actor is going down meanwhile. Once it is
                # asked to stop, for CLAIM_SHIELD_SECONDS more at most.
                asked = trio.current_time()
                claimed: Batch[ItemT] | None = None
                with trio.CancelScope(shield=True) as self._claiming:
                    claimed = await self._job.claim(free)
                self._claiming = None
                if claimed is None:  # cut short, nothing leased: the actor stops
                    return
                batch = claimed
                ends = asked + self._job.lease_seconds
                self._ends.update((id(item), (item, ends)) for item in batch.items)
                try:
                    await trio.lowlevel.checkpoint_if_cancelled()
                except trio.Cancelled:
                    await self._hand_back(batch.items)
                    raise
                if self._failing:
                    await self._hand_back(batch.items)
                    return
                for item in batch.items:
                    self._in_flight += 1
                    nursery.start_soon(self._perform, item)
                if batch.items:
                    idle_deadline = trio.current_time() + self._idle_seconds
                if len(batch.items) == free:
                    continue  # there may be more: claim again once a slot frees
                if batch.next_due_in is not None:
                    deadline = trio.current_time() + max(batch.next_due_in, 0.005)
            if self._in_flight == 0 and deadline == math.inf:
                deadline = idle_deadline
            with trio.move_on_at(deadline):
                await self._poked.wait()
            if (
                not self._poked.is_set()
                and self._in_flight == 0
                and trio.current_time() >= idle_deadline
            ):
                return  # idle: nothing in flight, nothing scheduled

    async def _perform(self, item: ItemT) -> None:
        done = False
        try:
            outcome = await self._job.perform(item)
            self._done.append((item, outcome))
            done = True
        finally:
            self._in_flight -= 1
            if not done:
                self._failing = True
                # Failed, or cut short (shutdown): give the row back for
                # another try now.
                await self._hand_back([item])
            self._to_record.set()

    async def _recorder(self) -> None:
        while True:
            await self._to_record.wait()
            self._to_record = trio.Event()
            batch, self._done = self._done, []
            if batch:
                try:
                    await self._job.record(batch)
                except BaseException as error:
                    if isinstance(error, Exception) and outage(error):
                        # Nothing more is claimed; the rows in flight finish (one cut short
                        # may be done twice) and all are recorded as the actor ends (_settle).
                        self._done[:0] = batch
                        self._failing = True
                        self._poked.set()
                        return
                    # Not recorded otherwise (a shutdown cut it short): hand the rows back.
                    await self._hand_back([item for item, _ in batch])
                    raise
                for item, _outcome in batch:
                    self._ends.pop(id(item), None)
                self._poked.set()  # a retry due at once may be claimable now
            if self._closing and self._in_flight == 0 and not self._done:
                return

    async def _hand_back(self, items: Sequence[ItemT], *, shield: bool = True) -> None:
        """Release ``items``, retried while storage is down (``handback``)."""
        if not items:
            return
        until = self._until(items)
        try:
            await hand_back(lambda: self._job.release(items), until=until,
                            stopping=self._stopping, shield=shield)
        finally:
            for item in items:
                self._ends.pop(id(item), None)

    def _until(self, items: Sequence[ItemT]) -> float:
        """When a hand-back of ``items`` must have happened by."""
        ends = (self._ends.get(id(item), (item, 0.0))[1] for item in items)
        return min(ends, default=0.0) - LEASE_MARGIN

    async def _settle(self) -> None:
        """What the actor leaves leased as it ends (its recorder failed while
        rows went on finishing): rows performed are recorded, the others
        handed back; while storage is down, once it answers (``handback``).
        In a shutdown, not shielded: what the rows in flight handed back
        already took the shutdown's last shielded wait, and a shutdown past
        its grace leaves the rest to their leases."""
        shield = not self._stopping()
        done, self._done = self._done, []
        if done:
            items = [item for item, _outcome in done]
            try:
                if await hand_back(lambda: self._job.record(done), until=self._until(items),
                                   stopping=self._stopping, shield=shield):
                    for item in items:
                        self._ends.pop(id(item), None)
            except Exception:
                log.warning("could not record %d rows as the actor ended; they are handed "
                            "back", len(done), exc_info=True)
        left = [item for item, _ends in self._ends.values()]
        if left:
            await self._hand_back(left, shield=shield)
