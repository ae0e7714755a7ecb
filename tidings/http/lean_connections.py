"""Hypercorn's HTTP/1.1 connections on trio, without the work a request does not need.

Two pieces of hypercorn's per-request bookkeeping cost more CPU than they
are worth (measured with a bare ASGI function on hypercorn's trio worker,
``POST`` of a small JSON body, wrk with 16 connections: 1.4–2.0 ms of CPU a
request before, 1.1–1.2 ms after; docs/benchmarks.md, "The connection's own
costs"):

- **The keep-alive timer.** Hypercorn stops the timer when a request arrives
  and starts it again when the response is done, each time by cancelling a
  task and starting a new one with ``nursery.start``. ``KeepAliveTimer``
  keeps one task for the life of the connection and moves its deadline
  instead: arming and disarming are assignments, with no task switch.
- **The response's writes.** Hypercorn writes a response's head, its body
  and its end (an empty write for a ``Content-Length`` body) separately,
  each under the connection's send lock and a shielded cancel scope.
  ``LeanH11Protocol`` holds the head back and writes it with the first body
  bytes, the way uvicorn does: a small response is one write.

``LeanH11Protocol`` also gives each request a ``Departure``, through which
the application learns that its client has gone without a task waiting on
``receive`` for it (``tidings.http.departure``).

``LeanTCPServer`` also limits each write to ``WRITE_SECONDS``: hypercorn's
own write has no timeout and ignores cancellation, so a client that stopped
reading held its connection, and the server's shutdown, for ever. And an
error that escapes one connection ends that connection alone.

None of this has a setting in hypercorn, so ``install()`` puts the two classes
in place of the names hypercorn's trio worker looks up
(``hypercorn.trio.run.TCPServer`` and ``hypercorn.protocol.H11Protocol``),
after checking that the pinned hypercorn still has the shape they rely on.
"""

from __future__ import annotations

import logging
import math
import resource
from typing import Any

import h11
import hypercorn.protocol
import hypercorn.trio.run
import trio
from hypercorn.events import Closed, RawData
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.tcp_server import MAX_RECV, TCPServer

from tidings.http.departure import DEPARTURE, Departure, departure_of
from tidings.http.envelope import error_body
from tidings.http.protocol_errors import EnvelopeH11Protocol
from tidings.logging_setup import choose_request_id

log = logging.getLogger("tidings.http")


class KeepAliveTimer:
    """The keep-alive timer of one connection: one task whose deadline moves.

    It behaves as hypercorn's own timer (``TCPServer._idle_timeout``): once
    the connection has been idle for ``keep_alive_timeout`` seconds, or at
    once when the server is stopping and the connection is idle, the server
    closes the connection. ``restart`` arms it (the connection became idle)
    and ``stop`` disarms it (a request arrived); neither waits.
    """

    def __init__(self, server: TCPServer) -> None:
        self._server = server
        self._armed = False
        self._deadline = math.inf
        self._scope: trio.CancelScope | None = None
        self._watching = False
        self._finished = False

    async def restart(self, task_group: Any, action: Any) -> None:
        """Arm the timer. ``action`` is hypercorn's own timeout, which this replaces."""
        self._armed = True
        if self._server.context.terminated.is_set():
            self._set_deadline(-math.inf)  # stopping: an idle connection ends now
        else:
            self._set_deadline(trio.current_time() + self._server.config.keep_alive_timeout)
        if not self._watching and not self._finished:
            self._watching = True
            task_group._nursery.start_soon(self._watch)

    async def stop(self) -> None:
        """Disarm the timer while a request is served."""
        self._armed = False
        self._set_deadline(math.inf)

    def close(self) -> None:
        """End the timer: nothing more is read from the connection, which ends."""
        self._finished = True
        if self._scope is not None:
            self._scope.cancel()

    def _set_deadline(self, deadline: float) -> None:
        self._deadline = deadline
        if self._scope is not None:
            self._scope.deadline = deadline

    async def _watch(self) -> None:
        terminated = self._server.context.terminated
        while not self._finished:
            with trio.CancelScope(deadline=self._deadline) as scope:
                self._scope = scope
                if terminated.is_set():
                    await trio.sleep_forever()
                else:
                    await terminated.wait()
            self._scope = None
            due = self._armed and (terminated.is_set() or trio.current_time() >= self._deadline)
            if due and not self._finished:
                # Idle past the deadline, or idle while the server stops. (When
                # not due, a request came in meanwhile, or came and went and
                # the timer was armed again: the deadline that holds now counts.)
                with trio.CancelScope(shield=True):
                    await self._server._initiate_server_close()
                return


# How long one write to a client may take before the client is taken to be
# gone (CONFIG_WRITE_SECONDS on hypercorn's config sets it per server).
WRITE_SECONDS = 30.0
CONFIG_WRITE_SECONDS = "tidings_write_seconds"
# The server's ConnectionCap, on hypercorn's config.
CONFIG_CONNECTIONS = "tidings_connections"
# Files kept for what is not a client connection (PostgreSQL, SMTP, webhook
# receivers, logs) when the cap is worked out from the open-file limit.
FILE_RESERVE = 1024
MIN_CONNECTIONS = 64
# How often a server at its cap says so in the log.
CAP_LOG_SECONDS = 10.0
# The answer to a connection over the cap, written before anything is read.
OVER_CAP = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"retry-after: 1\r\nconnection: close\r\nx-request-id: %s\r\n"
    b"content-length: %d\r\n\r\n%s"
)


def default_max_connections() -> int:
    """The process's open-file limit less ``FILE_RESERVE``, at least ``MIN_CONNECTIONS``."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 100_000
    return max(MIN_CONNECTIONS, soft - FILE_RESERVE)


class ConnectionCap:
    """How many client connections a server holds open at once.

    Past the cap a new connection is answered 503 and closed before anything
    is read from it: without a cap, clients that hold connections open (one
    request every keep-alive period is enough) took every file the process
    may open, and with them its connections to PostgreSQL and to the mail
    and webhook servers, and its health probes.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0
        self.refused = 0
        self._logged_at = -math.inf

    def enter(self) -> bool:
        if self.open >= self.limit:
            self.refused += 1
            now = trio.current_time()
            if now - self._logged_at >= CAP_LOG_SECONDS:
                self._logged_at = now
                log.warning("%d client connections open, the most allowed "
                            "(TIDINGS_MAX_CONNECTIONS): refusing new ones (%d so far)",
                            self.open, self.refused)
            return False
        self.open += 1
        return True

    def leave(self) -> None:
        self.open -= 1


class LeanTCPServer(TCPServer):
    """Hypercorn's trio connection, with the keep-alive timer above, and a
    limit on each write.

    hypercorn writes under a shielded cancel scope and without a timeout, so
    a client that stops reading a response (its receive window full) held
    its connection for ever and kept a shutdown from ending, even past its
    deadline. A write that takes longer than ``WRITE_SECONDS`` ends the
    connection, as a write to a client that has gone does.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.idle_task = KeepAliveTimer(self)  # type: ignore[assignment]
        # Set when the connection is closed, or its last write failed: the
        # end of the response that an EOF from the client waits for.
        self._answered = trio.Event()

    async def run(self) -> None:
        cap: ConnectionCap | None = getattr(self.config, CONFIG_CONNECTIONS, None)
        if cap is not None and not cap.enter():
            await self._refuse()
            return
        # An error that escapes one connection's handling ends that
        # connection, not the server: hypercorn runs every connection in the
        # server's nursery, where it ended the serving of all of them.
        try:
            await super().run()
        except Exception:
            log.exception("a connection failed and was closed; the server goes on")
        finally:
            if cap is not None:
                cap.leave()

    async def _refuse(self) -> None:
        body = error_body("SERVICE_UNAVAILABLE", "the server holds as many connections as it "
                          "may; retry shortly")
        with trio.move_on_after(1):
            try:
                rid = choose_request_id(None).encode()
                await self.stream.send_all(OVER_CAP % (rid, len(body), body))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        await self.stream.aclose()

    async def protocol_send(self, event: Any) -> None:
        if not isinstance(event, RawData):
            await super().protocol_send(event)
            return
        seconds = getattr(self.config, CONFIG_WRITE_SECONDS, WRITE_SECONDS)
        async with self.send_lock:
            try:
                with trio.CancelScope(shield=True), trio.fail_after(seconds):
                    await self.stream.send_all(event.data)
            except trio.TooSlowError:
                self._answered.set()
                await self.stream.aclose()  # also ends the read of this connection
                await self.protocol.handle(Closed())
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._answered.set()
                await self.protocol.handle(Closed())

    async def _read_data(self) -> None:
        # hypercorn's own loop, but for the end of the client's data (EOF)
        # while a request it sent whole is being answered: that is a client
        # that has said all it will say (``shutdown(SHUT_WR)``, as RFC 9112
        # §9.6 allows), not one that has gone. hypercorn took it for a
        # disconnect: the handler was cancelled and the response lost. Now
        # the response is written first; the protocol closes the connection
        # after it, as for ``Connection: close``. A client that has really
        # gone shows when the response's write fails, as for any response.
        try:
            while True:
                try:
                    with trio.fail_after(self.config.read_timeout or math.inf):
                        data = await self.stream.receive_some(MAX_RECV)
                except (trio.ClosedResourceError, trio.BrokenResourceError, trio.TooSlowError):
                    break
                answering = data == b"" and self._answering_whole_request()
                await self.protocol.handle(RawData(bytes(data)))
                if data == b"":
                    if answering:
                        await self._answered.wait()
                    break
            await self.protocol.handle(Closed())
        finally:
            # Hypercorn's own timer outlives a connection that its client
            # closed while idle, until the keep-alive timeout; this one ends
            # with it.
            self.idle_task.close()  # type: ignore[attr-defined]

    def _answering_whole_request(self) -> bool:
        protocol = getattr(self.protocol, "protocol", None)
        if not isinstance(protocol, LeanH11Protocol) or protocol.stream is None:
            return False
        connection = protocol.connection
        # ``completed``: the request's end has arrived (protocol_errors).
        return bool(getattr(connection, "completed", False)) and connection.our_state in (
            h11.SEND_RESPONSE, h11.SEND_BODY)

    async def _close(self) -> None:
        self._answered.set()
        await super()._close()


class LeanH11Protocol(EnvelopeH11Protocol):
    """Hypercorn's HTTP/1.1 protocol (with Tidings' error envelopes) whose
    response head goes out with the first body bytes, in one write."""

    _head = b""

    async def _send_h11_event(self, event: Any) -> None:
        try:
            data = self.connection.send(event)
        except h11.LocalProtocolError:
            if self.connection.their_state != h11.ERROR:
                raise
            return
        if isinstance(event, h11.Response):
            self._head = data  # written with what follows it
            return
        head, self._head = self._head, b""
        if head or data:
            await self.send(RawData(data=head + data))

    async def _maybe_recycle(self) -> None:
        head, self._head = self._head, b""
        if head:  # a response that ended without a body message
            await self.send(RawData(data=head))
        await super()._maybe_recycle()

    async def _create_stream(self, request: h11.Request) -> None:
        await super()._create_stream(request)
        # The application's task is started but has not run: nothing since
        # has waited. (Were it to run first, it would not find the extension
        # and would watch ``receive`` instead: tidings.http.departure.)
        scope = getattr(self.stream, "scope", None)
        if scope is not None:
            scope["extensions"][DEPARTURE] = Departure()

    async def _close_stream(self) -> None:
        scope = getattr(self.stream, "scope", None)
        departure = None if scope is None else departure_of(scope)
        if departure is not None:
            departure.depart()
        await super()._close_stream()


def install() -> None:
    """Put the lean connection classes in place in hypercorn (idempotent)."""
    _replace(hypercorn.trio.run, "TCPServer", TCPServer, LeanTCPServer)
    if not all(hasattr(TCPServer, name)
               for name in ("_initiate_server_close", "_idle_timeout", "_read_data", "_close")):
        raise RuntimeError("hypercorn's TCPServer has changed: cannot install its keep-alive timer")
    _replace(hypercorn.protocol, "H11Protocol", H11Protocol, LeanH11Protocol)
    needed = ("_send_h11_event", "_maybe_recycle", "_create_stream", "_close_stream")
    if not all(hasattr(H11Protocol, name) for name in needed):
        raise RuntimeError("hypercorn's H11Protocol has changed: cannot install its writes")


def _replace(module: Any, name: str, original: type, replacement: type) -> None:
    current = getattr(module, name, None)
    if current is replacement:
        return
    if current is not original:
        raise RuntimeError(f"{module.__name__}.{name} is not hypercorn's own: cannot install")
    setattr(module, name, replacement)
