"""The front door: storage-unit routes served straight from ASGI, the rest by Quart.

Quart's per-request machinery (a request object with its header copy, a
nursery with two tasks, the app and request contexts, the hooks, a response
object) cost more CPU than everything Tidings itself does for a
``POST /contacts``. A storage-unit route needs none of it: its handler runs
on the asyncio side with nothing but its connection (``pipeline.run_unit``).
``FrontDoor`` therefore answers those routes itself, and hands every other
request, unchanged, to the Quart application.

It answers exactly as the Quart path does (``pipeline.run_as_unit`` and the
hooks and error handlers of ``tidings/http/app.py``): the same URL rules
(Quart's own map decides which route a path is, so 404, 405 with ``Allow``,
``OPTIONS``, ``HEAD`` and redirects stay Quart's), the same checks in the
same order (the token, from the cache or looked up, its permission and rate
limit, then the body with its 413 and 408: a request without a valid token
is refused before its body is waited for), the same envelopes and headers,
the request id, the access log line and the metrics. A response given before
the body was read lets the rest of the body in while it is sent, as Quart's
background reader does, so the connection stays usable (``tidings/http/connection.py``).

Load shedding wraps this (``tidings/http/shedding.py``): a shed request
never gets here.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any
from uuid import UUID

import trio
from werkzeug.datastructures import Headers
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge, RequestTimeout
from werkzeug.routing import Map
from werkzeug.sansio.request import Request as RequestView
from werkzeug.sansio.utils import get_content_length

from tidings.http.admission import admission, still_admitted
from tidings.http.departure import cancelled_on_disconnect
from tidings.http.envelope import (
    ApiError,
    conflict,
    error_body,
    no_content,
    payment_required,
    storage_failure,
)
from tidings.http.idempotency_key import IDEMPOTENCY_HEADER, fingerprint, one_key_header
from tidings.http.pipeline import Incoming, run_incoming
from tidings.http.ratelimit import RateLimiter
from tidings.http.routing import MUTATING, Route
from tidings.logging_setup import choose_request_id, log_access, request_id
from tidings.storage.errors import Duplicate
from tidings.storage.quotas import QuotaExceeded

if TYPE_CHECKING:
    from tidings.service import Service

log = logging.getLogger("tidings.http")

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Answer = tuple[int, bytes, list[tuple[bytes, bytes]]]

JSON_TYPE = (b"content-type", b"application/json")
# The status a request whose client left before its answer is logged with.
CLIENT_GONE = 499
INTERNAL = error_body("INTERNAL_ERROR", "internal error; the details are in the server log")
KEY_HEADER = IDEMPOTENCY_HEADER.lower().encode()


class _Gone(Exception):
    """The client disconnected before its body arrived: nothing is answered."""


def http_error_answer(
    error: HTTPException, method: str, path: str, body_limit: int | None
) -> tuple[int, bytes, dict[str, str]]:
    """The envelope of a werkzeug HTTP error (404, 405 with ``Allow``, 413, 408...)."""
    status = error.code or 500
    headers: dict[str, str] = {}
    if status == 404:
        message = f"no route for {method} {path}"
    elif status == 405:
        allowed = sorted(getattr(error, "valid_methods", None) or [])
        message = f"method {method} is not allowed on {path}"
        if allowed:
            message += f"; allowed: {', '.join(allowed)}"
            # RFC 9110 §15.5.6: a 405 names the methods the resource supports.
            headers["Allow"] = ", ".join(allowed)
    elif status == 413:
        message = f"request body is larger than the limit of {body_limit} bytes"
    else:
        message = error.description or error.name
    code = HTTP_CODES.get(status, "INTERNAL_ERROR" if status >= 500 else "BAD_REQUEST")
    return status, error_body(code, message), headers


HTTP_CODES = {
    400: "BAD_REQUEST",
    401: "UNAUTHORIZED",
    403: "FORBIDDEN",
    404: "NOT_FOUND",
    405: "BAD_REQUEST",
    409: "CONFLICT",
    413: "PAYLOAD_TOO_LARGE",
    422: "UNPROCESSABLE_ENTITY",
    429: "TOO_MANY_REQUESTS",
    503: "SERVICE_UNAVAILABLE",
}


def _encoded(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(name.lower().encode(), value.encode()) for name, value in headers.items()]


class _Request:
    """One request as the front door reads it: the headers it needs, and its body."""

    __slots__ = (
        "authorization", "sent_id", "key_headers", "content_length", "transfer_encoding",
        "complete", "limit", "admitted",
    )

    def __init__(self, scope: MutableMapping[str, Any]) -> None:
        self.authorization: list[str] = []
        self.sent_id: str | None = None
        self.key_headers: list[str] = []
        self.content_length: str | None = None
        self.transfer_encoding: str | None = None
        self.complete = False
        self.limit: int | None = None
        # The team of the admitted token, for the access log (pipeline.admission).
        self.admitted: list[UUID] = []
        # Header values as Quart reads them: latin-1; every Authorization and
        # Idempotency-Key (more than one is refused), the first of other repeats.
        for name, value in scope["headers"]:
            name = name.lower()
            if name == b"authorization":
                self.authorization.append(value.decode("latin-1"))
            elif name == b"x-request-id":
                if self.sent_id is None:
                    self.sent_id = value.decode("latin-1")
            elif name == KEY_HEADER:
                self.key_headers.append(value.decode("latin-1"))
            elif name == b"content-length":
                if self.content_length is None:
                    self.content_length = value.decode("latin-1")
            elif name == b"transfer-encoding" and self.transfer_encoding is None:
                self.transfer_encoding = value.decode("latin-1")

    @property
    def announces_body(self) -> bool:
        """Whether a body follows the headers (h11 refuses a malformed length)."""
        return self.transfer_encoding is not None or self.content_length not in (None, "0")



class FrontDoor:
    """The ASGI application: storage-unit routes here, everything else to ``fallback``."""

    def __init__(
        self,
        fallback: Callable[..., Awaitable[None]],
        service: Service,
        rate_limiter: RateLimiter,
        url_map: Map,
        routes: list[Route],
        *,
        body_timeout: float | None,
        response_timeout: float | None,
    ) -> None:
        self._fallback = fallback
        self._service = service
        self._limiter = rate_limiter
        self._adapter = url_map.bind("localhost")
        self._units = {
            f"{route.method} {route.path}": route
            for route in routes if route.storage_unit and not route.public
        }
        self._body_timeout = math.inf if body_timeout is None else body_timeout
        self._response_timeout = math.inf if response_timeout is None else response_timeout

    async def __call__(
        self, scope: MutableMapping[str, Any], receive: Receive, send: Send
    ) -> None:
        if scope["type"] == "http":
            route, values = self._match(scope)
            if route is not None:
                await self._serve(route, values, scope, receive, send)
                return
        await self._fallback(scope, receive, send)

    def _match(self, scope: MutableMapping[str, Any]) -> tuple[Route | None, dict[str, Any]]:
        path: str = scope["path"]
        if scope.get("root_path") or not path.startswith("/"):
            return None, {}
        try:
            endpoint, values = self._adapter.match(path, scope["method"])
        except Exception:  # 404, 405, a redirect: Quart answers those
            return None, {}
        route = self._units.get(str(endpoint))
        if route is None or route.method != scope["method"]:
            return None, {}  # e.g. an OPTIONS or HEAD request
        return route, dict(values)

    async def _serve(
        self, route: Route, values: dict[str, Any], scope: MutableMapping[str, Any],
        receive: Receive, send: Send,
    ) -> None:
        started = time.perf_counter()
        exchange = _Request(scope)
        rid = choose_request_id(exchange.sent_id)
        request_id.set(rid)
        method: str = scope["method"]
        try:
            call, (status, body, headers) = await self._run(
                route, values, scope, exchange, receive
            )
            call.committed()
            answer = self._answer(status, body, headers)
        except _Gone:
            # No answer: the client has gone. Logged and counted as 499, as
            # nginx names a request its client closed.
            elapsed = time.perf_counter() - started
            self._service.metrics.observe(method, route.path, CLIENT_GONE, elapsed)
            team_id = exchange.admitted[0] if exchange.admitted else None
            log_access(method, route.path, CLIENT_GONE, elapsed, team_id, rid)
            return
        except Exception as error:  # noqa: BLE001 - every error becomes an envelope
            answer = self._error(error, method, scope["path"], exchange.limit)
        status, body, encoded = answer
        elapsed = time.perf_counter() - started
        self._service.metrics.observe(method, route.path, status, elapsed)
        encoded.append((b"x-request-id", rid.encode()))
        team_id = exchange.admitted[0] if exchange.admitted else None
        log_access(method, route.path, status, elapsed, team_id, rid)
        start = {"type": "http.response.start", "status": status, "headers": encoded}
        end = {"type": "http.response.body", "body": body, "more_body": False}
        if exchange.complete:
            with trio.move_on_after(self._response_timeout):
                await send(start)
                await send(end)
            return
        # Answered before the body arrived: let the rest in meanwhile, as
        # Quart's background reader does, so the connection can go on.
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._discard_body, receive)
            with trio.move_on_after(self._response_timeout):
                await send(start)
                await send(end)
            nursery.cancel_scope.cancel()

    async def _run(
        self, route: Route, values: dict[str, Any], scope: MutableMapping[str, Any],
        exchange: _Request, receive: Receive,
    ) -> Any:
        service = self._service
        version = service.tokens.version
        token = await admission(
            service, route, self._limiter, exchange.authorization, exchange.admitted
        )
        raw_body = b""
        if route.method in MUTATING:
            with self._limiter.uploads.receiving(token.team_id):
                raw_body = await self._read_body(
                    exchange, receive, route.max_body_bytes(service.config)
                )
            await still_admitted(service, token, exchange.authorization, version)
        elif not exchange.announces_body:
            # Its one message is there already: read, the connection knows
            # the request is whole. A body a route does not take (a GET with
            # Content-Length) is not waited for: it is let in while the answer
            # is sent, or the connection closes after it (``_serve``).
            if await self._discard_body(receive):
                raise _Gone()
            exchange.complete = True
        query: dict[str, Any] = {}
        mimetype = ""
        if route.query is not None or route.raw_body is not None or scope["query_string"]:
            query, mimetype = _query_and_mimetype(scope)
        key_header = one_key_header(exchange.key_headers)
        incoming = Incoming(
            token=token,
            path_values=values,
            query=query,
            raw_body=raw_body,
            mimetype=mimetype,
            key_header=key_header,
            fingerprint=b"" if key_header is None else fingerprint(
                scope["method"], scope["path"], scope["query_string"], raw_body
            ),
        )
        # A disconnect reported meanwhile cancels the request, as in Quart (one
        # after a whole request is not seen until the answer: architecture.md).
        result: Any = None
        failure: Exception | None = None
        async with cancelled_on_disconnect(scope, receive):
            try:
                result = await run_incoming(service, route, incoming)
            except Exception as error:  # noqa: BLE001 - raised below, not in a group
                failure = error
        if failure is not None:
            raise failure
        if result is None:
            raise _Gone()
        return result

    async def _read_body(self, exchange: _Request, receive: Receive, limit: int) -> bytes:
        """The body, 413 as soon as it is known to exceed ``limit`` (as
        ``parsing.read_body``), 408 after the body timeout."""
        exchange.limit = limit
        length = get_content_length(exchange.content_length, exchange.transfer_encoding)
        if length is not None and length > limit:
            raise RequestEntityTooLarge()
        received = bytearray()
        with trio.move_on_after(self._body_timeout) as waiting:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise _Gone()
                if message["type"] != "http.request":
                    continue
                received += message.get("body", b"")
                if not message.get("more_body", False):
                    exchange.complete = True
                if len(received) > limit:
                    raise RequestEntityTooLarge()
                if exchange.complete:
                    break
        if waiting.cancelled_caught:
            raise RequestTimeout()
        return bytes(received)

    @staticmethod
    async def _discard_body(receive: Receive) -> bool:
        """Read the rest of the body; whether the client disconnected instead."""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return True
            if not message.get("more_body", False):
                return False

    @staticmethod
    def _answer(status: int, body: bytes, headers: dict[str, str]) -> Answer:
        if status == 204:
            return 204, b"", _encoded(dict(no_content(headers).headers.items()))
        encoded = _encoded(headers) if headers else []
        encoded.append(JSON_TYPE)
        encoded.append((b"content-length", str(len(body)).encode()))
        return status, body, encoded

    def _error(self, error: Exception, method: str, path: str, limit: int | None) -> Answer:
        """The answer of the app's error handlers to ``error``."""
        if (failure := storage_failure(error)) is not None:
            log.warning("%s %s: %s (%s)", method, path, failure.message, error)
            error = failure
        if isinstance(error, ApiError):
            return self._answer(
                error.status, error_body(error.code, error.message), error.headers
            )
        if isinstance(error, Duplicate):
            refusal = conflict(f"{error.field}: {error.message}")
            return self._answer(refusal.status, error_body(refusal.code, refusal.message), {})
        if isinstance(error, QuotaExceeded):
            refusal = payment_required(error)
            return self._answer(
                refusal.status, error_body(refusal.code, refusal.message), refusal.headers
            )
        if isinstance(error, HTTPException):
            return self._answer(*http_error_answer(error, method, path, limit))
        log.error("unhandled error in %s %s", method, path, exc_info=error)
        return self._answer(500, INTERNAL, {})


def _query_and_mimetype(scope: MutableMapping[str, Any]) -> tuple[dict[str, Any], str]:
    """The query values and the body's media type, parsed by the same werkzeug
    request class Quart's requests are."""
    headers = Headers()
    for name, value in scope["headers"]:
        headers.add(name.decode("latin1").title(), value.decode("latin1"))
    view = RequestView(
        scope["method"], scope["scheme"], None, "", scope["path"], scope["query_string"],
        headers, None,
    )
    values: dict[str, Any] = {}
    for name in view.args:
        found = view.args.getlist(name)
        values[name] = found[0] if len(found) == 1 else found
    return values, view.mimetype
