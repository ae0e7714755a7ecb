"""Between hypercorn and the Quart app: every exchange leaves its connection sound.

Hypercorn's HTTP/1.1 protocol does its connection bookkeeping (start the next
request cycle, re-arm the keep-alive timer, or close the socket) inside the
application's ``send`` of the last body message, and from there it hands the
application ``http.disconnect``. quart-trio answers that message by
cancelling the nursery that runs the very ``send`` still in progress, so the
bookkeeping is cut short at its next checkpoint. When the request body had
not fully arrived (a route that answers without reading it) hypercorn was
closing the connection, and the cancelled close leaves it open and deaf: the
next request on it is never answered. With ``Connection: close`` the socket
stays open until the client closes it. (docs/upstream/ has the report.)

``SoundConnections`` wraps the ASGI application:

- The last body message is sent under a shield, so hypercorn's bookkeeping
  runs whole.
- Before a response starts, the rest of the request body is let in (quart
  reads it in the background and discards what the handler did not want),
  within ``DRAIN_SECONDS`` and when at most ``DRAIN_BYTES`` are announced,
  so the connection can serve the next request. Otherwise the response says
  ``Connection: close`` and the connection ends after it. A response that
  says ``Connection: close`` already (a shed request's 503) does not wait.
- An application that ends without a response gets a 500 envelope.
- Once the server is stopping (``stopping`` set), every response says
  ``Connection: close``: the connection ends after it, and the client knows
  not to send another request on it (one sent anyway would never be
  answered, and the client could not tell whether it ran).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import trio

from tidings.http.envelope import error_body

log = logging.getLogger("tidings.http")

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[MutableMapping[str, Any], Receive, Send], Awaitable[None]]

# How long a response waits for the rest of a body it does not need.
DRAIN_SECONDS = 2.0
# Larger announced bodies are not waited for: the connection closes instead.
DRAIN_BYTES = 64 * 1024 * 1024


def _announced_length(scope: MutableMapping[str, Any]) -> int | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _closes(start: Message) -> bool:
    """Whether the response that ``start`` begins ends its connection."""
    return any(
        name.lower() == b"connection" and b"close" in value.lower()
        for name, value in start.get("headers", ())
    )


class _Exchange:
    """One request and its response, as the wrapped application sees them."""

    def __init__(
        self, scope: MutableMapping[str, Any], receive: Receive, send: Send,
        stopping: trio.Event,
    ) -> None:
        self._receive = receive
        self._send = send
        self._stopping = stopping
        self._announced = _announced_length(scope)
        self.body_received = trio.Event()
        self.started = False

    async def receive(self) -> Message:
        message = await self._receive()
        kind = message["type"]
        if kind == "http.disconnect" or (kind == "http.request" and not message.get("more_body")):
            self.body_received.set()
        return message

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.started = True
            if not _closes(message) and (
                self._stopping.is_set()
                or (not self.body_received.is_set() and not await self._drained())
            ):
                message = dict(message)
                message["headers"] = [*message.get("headers", ()), (b"connection", b"close")]
        if kind == "http.response.body" and not message.get("more_body", False):
            # Hypercorn recycles or closes the connection within this call.
            with trio.CancelScope(shield=True):
                await self._send(message)
            return
        await self._send(message)

    async def _drained(self) -> bool:
        if self._announced is not None and self._announced > DRAIN_BYTES:
            return False
        with trio.move_on_after(DRAIN_SECONDS):
            await self.body_received.wait()
        return self.body_received.is_set()


class SoundConnections:
    """The ASGI application ``app``, made safe for kept-alive connections."""

    def __init__(self, app: ASGIApp, stopping: trio.Event | None = None) -> None:
        self.app = app
        self.stopping = trio.Event() if stopping is None else stopping

    async def __call__(
        self, scope: MutableMapping[str, Any], receive: Receive, send: Send
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        exchange = _Exchange(scope, receive, send, self.stopping)
        try:
            await self.app(scope, exchange.receive, exchange.send)
        except trio.Cancelled:
            raise
        except Exception:
            log.exception("unhandled error in %s %s", scope.get("method"), scope.get("path"))
        if not exchange.started:
            await exchange.send(
                {
                    "type": "http.response.start",
                    "status": 500,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await exchange.send(
                {
                    "type": "http.response.body",
                    "body": error_body(
                        "INTERNAL_ERROR", "internal error; the details are in the server log"
                    ),
                }
            )
