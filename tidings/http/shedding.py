"""Load shedding: a bound on the work one process accepts, checked before Quart runs.

``Shedder`` wraps the Quart application at the ASGI level. It counts the
requests in flight in this process and, apart, those among them that need
storage (every route but the public ones that never touch it). A request
that would exceed either bound is answered at once with 503
SERVICE_UNAVAILABLE and ``Retry-After``, before Quart parses anything:

- ``max_in_flight`` (``TIDINGS_MAX_IN_FLIGHT``): requests being handled at once.
- ``max_storage`` = ``TIDINGS_DB_POOL_SIZE`` + ``TIDINGS_MAX_DB_WAITERS``:
  requests that need storage at once; at most the pool's size hold a
  connection, so at most ``TIDINGS_MAX_DB_WAITERS`` wait for one.

So the queue in front of the pool, and with it the latency of the requests
that are accepted, stays bounded however many connections arrive. The
probes (``/healthz``, ``/livez``, ``/readyz``) and ``/metrics`` are never
counted nor shed.

A request with a body counts against storage only once its body has
arrived: a client that sends a body slowly (or never finishes it) holds a
place among the requests in flight, not one in the queue for the pool, so
a few slow uploads cannot turn every team's requests away. (A request
counts at arrival against the storage bound as it is then, so the bound
can be passed by the bodies completing together, at most by the requests
in flight.)

A request that carries both ``Content-Length`` and ``Transfer-Encoding`` is
answered 400 and its connection closed (RFC 9112 §6.1): read one way by a
proxy in front and the other way here, its body could hide a second request.

A request whose body comes in a content coding (``Content-Encoding: gzip``,
or any other but ``identity``) is answered 415 with ``Accept-Encoding:
identity`` (RFC 9110 §15.5.16), its connection closed: no route reads a
coded body, and one taken as it is would be refused as bad JSON, or worse
stored as it came (a raw report, a form).

A request stops counting when its response starts, not when its task ends:
the client may send its next request on the connection as soon as it has
the answer, and that request must not find the slot of the one before
still taken (under load, it did, and kept-alive clients were shed well
below the bounds); and the answer's own sending may wait, for the rest of a
body it did not need (up to 2 s, ``tidings.http.connection``), which is no
work of the process's and must hold no place (clients that announce a body
and never send it would otherwise take every place, without a token).

Single-threaded trio makes the counters safe without locks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio
from hypercorn.typing import ASGIReceiveCallable as Receive
from hypercorn.typing import ASGISendCallable as Send
from hypercorn.typing import HTTPScope, Scope

from tidings.http.envelope import error_body
from tidings.http.routing import MUTATING
from tidings.logging_setup import choose_request_id, log_access

ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

RETRY_AFTER_SECONDS = 1
# How long an ambiguous request's body is waited for before its answer.
DRAIN_SECONDS = 2.0
# Never counted nor shed: a probe must answer however busy the process is,
# and so must the metrics, whose scrape matters most when it is busy.
PROBES = frozenset({"/healthz", "/livez", "/readyz", "/metrics"})
# Public routes that never touch storage.
STORAGE_FREE = PROBES | {"/metrics", "/openapi.json"}
# Never shed and never touching storage: never answered 503.
NEVER_UNAVAILABLE = frozenset({"/livez", "/metrics"})


def _normalised(path: str) -> str:
    return path.rstrip("/") or "/"


class Shedder:
    """The ASGI wrapper. ``on_answer(method, route, status)`` is told of every
    request it answers itself (shed, ambiguous, in a content coding)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_in_flight: int,
        max_storage: int,
        on_answer: Callable[[str, str, int], None] = lambda _method, _route, _status: None,
    ) -> None:
        self.app = app
        self.max_in_flight = max_in_flight
        self.max_storage = max_storage
        self.in_flight = 0
        self.storage_in_flight = 0
        self.shed_total = 0
        self._on_answer = on_answer
        self._refusal = error_body(
            "SERVICE_UNAVAILABLE",
            f"the server is at capacity; retry after {RETRY_AFTER_SECONDS} s",
        )
        self._ambiguous = error_body(
            "BAD_REQUEST",
            "a request with both Content-Length and Transfer-Encoding is ambiguous "
            "(RFC 9112 §6.1); send one of them",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = _normalised(scope["path"])
        length, chunked, coding = _framing(scope)
        refusal: tuple[int, bytes, str, list[tuple[bytes, bytes]]] | None = None
        if length is not None and chunked:
            refusal = 400, self._ambiguous, "(ambiguous)", []
        elif coding is not None and (chunked or length):
            refusal = 415, error_body("BAD_REQUEST", (
                f"Content-Encoding: {coding[:40]} is not supported; send the body as it is "
                "(no content coding)"
            )), "(content coding)", [(b"accept-encoding", b"identity")]
        if refusal is not None:
            # The body is let in first (briefly), so the answer is sent
            # before the connection closes on what follows it.
            with trio.move_on_after(DRAIN_SECONDS):
                while (await receive()).get("more_body", False):
                    pass
            status, body, route, extra = refusal
            await self._answer(scope, send, status, body, route=route, extra=extra)
            return
        if path in PROBES:
            await self.app(scope, receive, send)
            return
        storage = path not in STORAGE_FREE
        if self.in_flight >= self.max_in_flight or (
            storage and self.storage_in_flight >= self.max_storage
        ):
            await self._refuse(scope, send)
            return
        self.in_flight += 1
        counted = True
        # A request with a body takes its storage place once the body is in;
        # one whose body no route reads (a GET's) at once, whatever it
        # announces: it is served without waiting for that body.
        holds_storage = storage and (
            scope["method"] not in MUTATING or (not chunked and not length)
        )
        self.storage_in_flight += holds_storage

        def release() -> None:
            nonlocal counted, holds_storage
            if counted:
                counted = False
                self.in_flight -= 1
                self.storage_in_flight -= holds_storage
                holds_storage = False

        async def receiving() -> Any:
            nonlocal holds_storage
            message = await receive()
            if (storage and counted and not holds_storage and message["type"] == "http.request"
                    and not message.get("more_body", False)):
                holds_storage = True
                self.storage_in_flight += 1
            return message

        async def sending(message: Any) -> None:
            # Its answer is decided: the request no longer counts, before the
            # answer goes out. Sending may wait (for the rest of a body the
            # answer did not need, tidings.http.connection, up to 2 s; for a
            # slow reader), and a place held meanwhile would let clients that
            # never send their body take every place without a valid token.
            if message["type"] == "http.response.start":
                release()
            await send(message)

        try:
            await self.app(scope, receiving, sending)
        finally:
            release()

    async def _refuse(self, scope: HTTPScope, send: Send) -> None:
        """503 without reading the body, and the connection closed."""
        self.shed_total += 1
        await self._answer(scope, send, 503, self._refusal, retry=True, route="(shed)")

    async def _answer(
        self, scope: HTTPScope, send: Send, status: int, body: bytes, *, retry: bool = False,
        route: str, extra: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        """An error envelope, and the connection closed; its access log line
        names ``route`` for the route it never reached."""
        rid = choose_request_id(_request_id_sent(scope))
        log_access(scope["method"], route, status, 0.0, None, rid)
        self._on_answer(scope["method"], route, status)
        headers = [
            # As every response: the client's request id when sane, else a new one.
            (b"x-request-id", rid.encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            # After a refusal a client that would resend at once must connect
            # again, and new connections are accepted one per turn of the event
            # loop, so flooding clients cannot crowd out the turns the accepted
            # requests need. After an ambiguous request, what follows its body
            # cannot be trusted.
            (b"connection", b"close"),
        ]
        if retry:
            headers.append((b"retry-after", str(RETRY_AFTER_SECONDS).encode()))
        headers += extra or []
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


def _request_id_sent(scope: HTTPScope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            return value.decode("latin-1")
    return None


def _framing(scope: HTTPScope) -> tuple[int | None, bool, str | None]:
    """The request's ``Content-Length`` (None: absent or unreadable), whether
    it has a ``Transfer-Encoding``, and the first content coding of its body
    other than ``identity`` (None: none)."""
    length: int | None = None
    chunked = False
    coding = None
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                length = int(value)
            except ValueError:
                length = None
        elif name == b"transfer-encoding":
            chunked = True
        elif name == b"content-encoding" and coding is None:
            codings = value.decode("latin-1").lower().replace(" ", "").split(",")
            coding = next((c for c in codings if c not in ("", "identity")), None)
    return length, chunked, coding
