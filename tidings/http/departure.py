"""How Tidings' server tells an application that a request's client has gone.

An ASGI server reports a client that went away mid-request as an
``http.disconnect`` message on ``receive``, so an application that wants to
stop work nobody will read the answer of needs a task waiting on
``receive`` beside that work: a nursery and a task for every request, about
40 µs of CPU here, about 5 % of a ``POST /contacts``.

Tidings' HTTP/1.1 protocol (``lean_connections.LeanH11Protocol``) puts a
``Departure`` in each request's ``scope["extensions"]`` under ``DEPARTURE``
before the application runs, and calls ``depart()`` where it hands the
application that ``http.disconnect`` (when the request's stream closes: the
client gone, or the exchange over). An application then only needs a cancel
scope: ``watch(scope)`` has it cancelled when the client goes. Under a server
without the extension, the application waits on ``receive`` as before
(``tidings.http.frontdoor``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import trio

DEPARTURE = "tidings.departure"

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]


class Departure:
    """The end of one request's stream, as its application may watch it."""

    __slots__ = ("gone", "_watched")

    def __init__(self) -> None:
        self.gone = False
        self._watched: trio.CancelScope | None = None

    def watch(self, scope: trio.CancelScope) -> None:
        """Cancel ``scope`` when the stream ends; at once if it has."""
        self._watched = scope
        if self.gone:
            scope.cancel()

    def depart(self) -> None:
        """The stream has ended: cancel what is watched (a block already left
        is not affected)."""
        self.gone = True
        if self._watched is not None:
            self._watched.cancel()


def departure_of(scope: MutableMapping[str, Any]) -> Departure | None:
    """The request's ``Departure``, if its server gives one."""
    extensions = scope.get("extensions")
    found = None if extensions is None else extensions.get(DEPARTURE)
    return found if isinstance(found, Departure) else None


@asynccontextmanager
async def cancelled_on_disconnect(
    scope: MutableMapping[str, Any], receive: Receive
) -> AsyncIterator[None]:
    """A block cancelled when the request's client goes: as the server tells
    it, or, under a server without the extension, as a task waiting on
    ``receive`` for ``http.disconnect`` sees it."""
    departure = departure_of(scope)
    if departure is not None:
        with trio.CancelScope() as block:
            departure.watch(block)
            yield
        return
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_cancel_on_disconnect, receive, nursery.cancel_scope)
        yield
        nursery.cancel_scope.cancel()


async def _cancel_on_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()
