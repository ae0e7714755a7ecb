"""Group commit for acceptance: concurrent sends of one team stored by one
statement.

A busy team's ``POST /emails`` requests arrive faster than PostgreSQL
commits them one by one. The first to arrive (the leader) stores its own
message at once, as it would alone; those that arrive while it does wait in
line, and the first of them, once the leader is done, stores everything in
line with one statement on its own connection and answers the others. Nobody
waits for a timer: a request alone is stored as soon as it comes, and a line
forms only while a statement is in flight. Each statement costs
PostgreSQL's executor start-up, a commit and a round trip once for the
group instead of once for each request (``docs/benchmarks.md``, "Accepting
emails").

A group is stored all or nothing. When it is refused (a domain not
verified, a quota exceeded, anything PostgreSQL or the caller's code
refuses), nothing is stored, and each member stores its own messages
alone, on its own connection, to get its own answer: one member's bad
input or a quota that has room for some of them fails no one else. When
storage did not answer the group's statement (``tidings.storage.errors.
outage``: the leader's connection lost, or the server down), whether it
committed is not known: the leader answers so, and each other member tries
again alone, on its own connection. Its messages' ids are those the group
used, so a retry cannot store them twice: one that finds them stored
(the group committed after all) answers, as the leader did, that storage
did not answer.

Asyncio only, on the loop that storage units run on: a request inside a
transaction (one with an ``Idempotency-Key``) is stored alone, since the
group's statement could not commit with it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from asyncpg import UniqueViolationError

from tidings.storage.connection import Connection
from tidings.storage.errors import outage

Key = TypeVar("Key", bound=Hashable)
Item = TypeVar("Item")
Stored = TypeVar("Stored")

# A waiting member's answers that are not its result.
_LEAD = object()  # store the line now, on your own connection
_ALONE = object()  # the group was refused: store yours alone


@dataclass(frozen=True)
class _Retry:
    """Storage did not answer the group's statement (``error``): store yours
    alone; if they were stored meanwhile, ``error`` is the answer."""

    error: Exception


# How often a cancelled leader looks whether anyone still waits (seconds).
_POLL = 0.05


@dataclass(eq=False)
class _Member(Generic[Item, Stored]):
    items: Sequence[Item]
    answer: asyncio.Future[object] | None = None
    stored: list[Stored] = field(default_factory=list)


Store = Callable[[Connection, Key, Sequence[Item]], Awaitable[list[Stored]]]


class Gathering(Generic[Key, Item, Stored]):
    """Lines of members, one per key (a team), each line stored by one call
    of ``store(conn, key, items)`` that returns what it stored, one per item
    in order, and stores all or nothing; ``most``: the items one call stores
    at most; ``grace``: the seconds a cancelled leader still waits for its
    group's statement before it cuts the statement short too."""

    def __init__(
        self, store: Store[Key, Item, Stored], most: int = 100, grace: float = 5.0
    ) -> None:
        self._store = store
        self._most = most
        self.grace = grace
        self._lines: dict[Key, deque[_Member[Item, Stored]]] = {}

    async def store(self, conn: Connection, key: Key, items: Sequence[Item]) -> list[Stored]:
        """What ``store`` returns for ``items``, stored with whatever of the
        same key waits beside them."""
        if conn.is_in_transaction() or len(items) >= self._most:
            return await self._store(conn, key, items)
        line = self._lines.get(key)
        if line is None:
            # Nobody is storing for this key: lead at once.
            self._lines[key] = deque()
            return await self._lead(conn, key, _Member(items))
        member: _Member[Item, Stored] = _Member(items, asyncio.get_running_loop().create_future())
        line.append(member)
        assert member.answer is not None
        try:
            answer = await member.answer
        except asyncio.CancelledError:
            if member in line:
                line.remove(member)
            elif _led(member):
                self._hand_on(key)  # never to lead: the next one does
            raise
        if answer is _LEAD:
            return await self._lead(conn, key, member)
        if answer is _ALONE:
            return await self._store(conn, key, items)
        if isinstance(answer, _Retry):
            try:
                return await self._store(conn, key, items)
            except UniqueViolationError:
                raise answer.error from None
        return member.stored

    async def _lead(
        self, conn: Connection, key: Key, own: _Member[Item, Stored]
    ) -> list[Stored]:
        """Store ``own`` with the members in line; then hand the line on."""
        line = self._lines[key]
        group = [own]
        count = len(own.items)
        while line and count + len(line[0].items) <= self._most:
            member = line.popleft()
            group.append(member)
            count += len(member.items)
        try:
            if len(group) == 1:
                return await self._store(conn, key, own.items)
            return await self._store_group(conn, key, group)
        finally:
            for member in group[1:]:
                _answer(member, _ALONE)  # only if left unanswered by an error of ours
            self._hand_on(key)

    async def _store_group(
        self, conn: Connection, key: Key, group: list[_Member[Item, Stored]]
    ) -> list[Stored]:
        items = [item for member in group for item in member.items]
        # The statement runs to its end even if the leader's request is
        # cancelled, while another member still waits for its answer; but
        # for no more than ``grace`` seconds (storage that hangs must not
        # hold a shutdown). Then, or as soon as nobody waits any more (a
        # shutdown cancels every request), it is cut short, and any member
        # still waiting tries alone (``_Retry``).
        task = asyncio.ensure_future(self._store(conn, key, items))
        loop = asyncio.get_running_loop()
        cancelled_at: float | None = None
        while not task.done():
            if cancelled_at is not None and (
                loop.time() - cancelled_at >= self.grace or not _waiting(group[1:])
            ):
                await _cut(task)
                if task.cancelled():
                    cut = TimeoutError("storage did not answer before the request was cut short")
                    for member in group[1:]:
                        _answer(member, _Retry(cut))
                    raise asyncio.CancelledError()
                break
            try:
                # asyncio.wait: a cancellation of the leader does not cancel the task.
                await asyncio.wait({task}, timeout=None if cancelled_at is None else _POLL)
            except asyncio.CancelledError:
                if cancelled_at is None:
                    cancelled_at = loop.time()
        cancelled = cancelled_at is not None
        try:
            stored = task.result()
        except Exception as error:
            if outage(error):
                for member in group[1:]:
                    _answer(member, _Retry(error))
                raise
            for member in group[1:]:
                _answer(member, _ALONE)
            if cancelled:
                raise asyncio.CancelledError() from None
            return await self._store(conn, key, group[0].items)
        start = 0
        for member in group:
            member.stored = stored[start:start + len(member.items)]
            start += len(member.items)
            if member is not group[0]:
                _answer(member, None)
        if cancelled:
            raise asyncio.CancelledError()
        return group[0].stored

    def _hand_on(self, key: Key) -> None:
        """The next in line leads; with nobody in line, the line ends."""
        line = self._lines.get(key)
        while line:
            member = line.popleft()
            if _answer(member, _LEAD):
                return
        self._lines.pop(key, None)


def _answer(member: _Member[Any, Any], answer: object) -> bool:
    """Give a waiting member its answer (an exception is raised to it);
    False if it has one already or no longer waits."""
    if member.answer is None or member.answer.done():
        return False
    if isinstance(answer, BaseException):
        member.answer.set_exception(answer)
    else:
        member.answer.set_result(answer)
    return True


def _waiting(members: Sequence[_Member[Any, Any]]) -> bool:
    """Whether any of ``members`` still waits for its answer (a request
    cancelled while it waits cancels its answer)."""
    return any(m.answer is not None and not m.answer.done() for m in members)


async def _cut(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` and wait for it to end, whatever cancels the caller
    meanwhile (asyncpg ends a cancelled query at once)."""
    task.cancel()
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            pass


def _led(member: _Member[Any, Any]) -> bool:
    """Whether ``member`` was told to lead (and so must hand the line on)."""
    answer = member.answer
    return (
        answer is not None and answer.done() and not answer.cancelled()
        and answer.exception() is None and answer.result() is _LEAD
    )
