"""Mailboxes and replies: how messages reach an actor and how answers come back.

A mailbox is a bounded trio memory channel. Its receiving side belongs to one
actor; senders reach it through a :class:`~tidings.actors.supervisor.Handle`.
A request carries a :class:`Reply` of buffer 1: the actor answers with
``reply.send(value)``, which never blocks and never raises when the caller has
gone away, so a caller that timed out cannot crash the actor.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any, Generic, TypeVar

import trio

T = TypeVar("T")
M = TypeVar("M")


class ActorError(Exception):
    """Base class for failures of the actor runtime seen by callers."""


class ActorStopped(ActorError):
    """The actor ended (crashed or shut down) before it answered."""


class MailboxFull(ActorError):
    """``try_send`` found the mailbox full: back-pressure, try later."""


class Reply(Generic[T]):
    """The answering end of one request. Buffer 1, answered at most once."""

    __slots__ = ("_send",)

    def __init__(self, send: trio.MemorySendChannel[T]) -> None:
        self._send = send

    def send(self, value: T) -> None:
        """Answer the caller; dropped silently if the caller has gone."""
        try:
            self._send.send_nowait(value)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.WouldBlock):
            pass
        self.close()

    def close(self) -> None:
        """End the request without an answer: the caller gets ActorStopped."""
        self._send.close()


def open_reply() -> tuple[Reply[T], trio.MemoryReceiveChannel[T]]:
    send, receive = trio.open_memory_channel[T](1)
    return Reply(send), receive


async def wait_reply(receive: trio.MemoryReceiveChannel[T]) -> T:
    """Wait for the answer of a request; ActorStopped if it never comes."""
    with receive:
        try:
            return await receive.receive()
        except trio.EndOfChannel:
            raise ActorStopped("the actor ended before it answered") from None


def close_reply_of(message: object) -> None:
    """Close the reply a message carries, if any (after handling, or on a crash)."""
    reply = getattr(message, "reply", None)
    if isinstance(reply, Reply):
        reply.close()


class Mailbox(Generic[M]):
    """The receiving side of an actor's mailbox, as the actor sees it.

    Iterating yields messages one at a time. Iteration ends when the actor has
    been idle for ``idle_timeout`` seconds or when the supervisor asks it to
    stop; the message being handled is always finished first. The reply of
    each message is closed once the next one is requested, so a handler that
    forgot to answer does not leave its caller waiting forever.
    """

    def __init__(
        self, receive: trio.MemoryReceiveChannel[M], idle_timeout: float | None
    ) -> None:
        self._receive = receive
        self.idle_timeout = idle_timeout
        self.current: M | None = None
        self.stopping = False
        self._wait_scope: trio.CancelScope | None = None

    def __aiter__(self) -> AsyncIterator[M]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[M]:
        while True:
            message = await self.next()
            if message is None:
                return
            yield message

    async def next(self, within: float | None = None) -> M | None:
        """The next message, or None when the actor should stop.

        ``within``: wait that long at most, in place of ``idle_timeout``; None
        then also when nothing came in time (``stopping`` tells which).
        """
        self.finish_current()
        if self.stopping:
            return None
        timeout = self.idle_timeout if within is None else within
        deadline = math.inf if timeout is None else trio.current_time() + timeout
        with trio.CancelScope(deadline=deadline) as scope:
            self._wait_scope = scope
            try:
                message = await self._receive.receive()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                self.stopping = True
                return None
            finally:
                self._wait_scope = None
            self.current = message
            return message
        # The wait was cancelled: idle for too long, or asked to stop.
        return None

    def finish_current(self) -> None:
        if self.current is not None:
            close_reply_of(self.current)
            self.current = None

    def request_stop(self) -> None:
        """Stop after the current message; wake the actor if it is waiting."""
        self.stopping = True
        if self._wait_scope is not None:
            self._wait_scope.cancel()

    def pending(self) -> int:
        return self._receive.statistics().current_buffer_used

    def drain_unanswered(self) -> None:
        """Close the replies of messages that will never be handled."""
        while True:
            try:
                message: Any = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return
            close_reply_of(message)
