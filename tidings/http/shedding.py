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
probes (``/healthz``, ``/readyz``) are never counted nor shed.

A request stops counting when the last message of its response is sent, not
when its task ends: the client may send its next request on the connection
as soon as it has the answer, and that request must not find the slot of
the one before still taken (under load, it did, and kept-alive clients were
shed well below the bounds).

Single-threaded trio makes the counters safe without locks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from hypercorn.typing import ASGIReceiveCallable as Receive
from hypercorn.typing import ASGISendCallable as Send
from hypercorn.typing import HTTPScope, Scope

from tidings.http.envelope import error_body

ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

RETRY_AFTER_SECONDS = 1
# Never counted nor shed: a probe must answer however busy the process is.
PROBES = frozenset({"/healthz", "/readyz"})
# Public routes that never touch storage.
STORAGE_FREE = PROBES | {"/metrics", "/openapi.json"}


def _normalised(path: str) -> str:
    return path.rstrip("/") or "/"


class Shedder:
    """The ASGI wrapper. ``on_shed(method)`` is told of every refused request."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_in_flight: int,
        max_storage: int,
        on_shed: Callable[[str], None] = lambda _method: None,
    ) -> None:
        self.app = app
        self.max_in_flight = max_in_flight
        self.max_storage = max_storage
        self.in_flight = 0
        self.storage_in_flight = 0
        self.shed_total = 0
        self._on_shed = on_shed
        self._refusal = error_body(
            "SERVICE_UNAVAILABLE",
            f"the server is at capacity; retry after {RETRY_AFTER_SECONDS} s",
        )
        self._headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(self._refusal)).encode()),
            (b"retry-after", str(RETRY_AFTER_SECONDS).encode()),
            # The connection is closed after a refusal: a client that would
            # resend at once must connect again, and new connections are
            # accepted one per turn of the event loop, so flooding clients
            # cannot crowd out the turns the accepted requests need.
            (b"connection", b"close"),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = _normalised(scope["path"])
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
        self.storage_in_flight += storage
        counted = True

        def release() -> None:
            nonlocal counted
            if counted:
                counted = False
                self.in_flight -= 1
                self.storage_in_flight -= storage

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                release()
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            release()

    async def _refuse(self, scope: HTTPScope, send: Send) -> None:
        """503 without reading the body, and the connection closed."""
        self.shed_total += 1
        self._on_shed(scope["method"])
        await send({"type": "http.response.start", "status": 503, "headers": self._headers})
        await send({"type": "http.response.body", "body": self._refusal, "more_body": False})
