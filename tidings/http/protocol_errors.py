"""Envelopes for requests that never reach the application.

A request line or header that h11 cannot parse, or a head over hypercorn's
``h11_max_incomplete_size``, is answered by hypercorn itself, before any
ASGI application runs, with an empty body. CONTRACT §2 allows nothing but
the error envelope, so this module gives hypercorn's HTTP/1.1 protocol a
subclass whose error answers carry one. Hypercorn has no setting for that
answer. ``tidings/http/lean_connections.py`` builds on this subclass and
puts the result in place of the one name that hypercorn's
``ProtocolWrapper`` looks up (``hypercorn.protocol.H11Protocol``).
"""

from __future__ import annotations

import re
from itertools import chain
from typing import Any
from urllib.parse import urlsplit

import h11
import trio
from hypercorn.events import Closed
from hypercorn.protocol.h11 import H11Protocol

from tidings.http.envelope import error_body
from tidings.logging_setup import choose_request_id, log_access

MESSAGES = {
    400: "the request is not valid HTTP/1.1: a malformed request line or header line, "
         "or a body that ended before its announced length",
    408: "the request took too long to arrive",
    413: "the request is too large",
    414: "the request target is too long",
    431: "the request line and headers together exceed {limit} bytes",
    501: "the request uses a method or a transfer coding Tidings does not implement "
         "(method names are case-sensitive, RFC 9110 §9.1: POST, not post; the one "
         "transfer coding is chunked)",
}


def head_size(request: h11.Request) -> int:
    """The bytes of the request line and header lines, as sent without extra spaces."""
    line = len(request.method) + len(request.target) + len(b"  HTTP/1.1\r\n")
    return line + sum(len(name) + len(value) + 4 for name, value in request.headers) + 2


# The methods of RFC 9110 that Tidings' routes use or answer (OPTIONS, PUT,
# TRACE: 405 where no route has them). Method names are case-sensitive (§9.1).
IMPLEMENTED_METHODS = frozenset(
    {b"GET", b"HEAD", b"POST", b"PUT", b"PATCH", b"DELETE", b"OPTIONS", b"TRACE"}
)
# A request target in absolute form (RFC 9112 §3.2.2): a scheme, then "://".
_ABSOLUTE_FORM = re.compile(rb"[A-Za-z][A-Za-z0-9+.-]*://")


def target_is_valid(method: bytes, target: bytes) -> bool:
    """A path from ``/`` (origin form), a whole URI (absolute form), or ``*``
    for OPTIONS (RFC 9112 §3.2). Anything else ("?x=1", "healthz") names no
    resource."""
    if target.startswith(b"/"):
        return True
    if target == b"*":
        return method == b"OPTIONS"
    if _ABSOLUTE_FORM.match(target) is None:
        return False
    try:  # as the application will read it: "http://[::1/x" is no URI
        urlsplit(target.decode("latin-1"))
    except ValueError:
        return False
    return True


class _Connection(h11.Connection):
    """h11's server connection, knowing whether the request now being answered
    has arrived whole."""

    completed = False

    def next_event(self) -> Any:
        event = super().next_event()
        if type(event) is h11.EndOfMessage:
            self.completed = True
        return event

    def start_next_cycle(self) -> None:
        super().start_next_cycle()
        self.completed = False


# The attribute of hypercorn's config that holds what counts the answers
# given here (the service's metrics): ``observe(method, route, status)``.
CONFIG_OBSERVE = "tidings_observe"


class EnvelopeH11Protocol(H11Protocol):
    """Hypercorn's HTTP/1.1 protocol, with error answers in the envelope, and
    the limit on the request's head kept however the head arrived.

    h11 applies ``h11_max_incomplete_size`` only to a head still incomplete in
    its buffer, so a larger head that arrives in one read passed; the limit is
    checked again on the whole head here.

    Bytes after a whole request that closes the connection (``Connection:
    close``, HTTP/1.0, or an answer that closes it, as a shed request's
    503) are not a malformed request: RFC 9112 §9.6 has the server answer
    that request and then close, reading nothing more. h11 calls them an
    error, and hypercorn answered it with a 400 in place of the response, or
    closed the connection at once when the response had begun; here the
    response under way is sent whole and the connection closes after it.

    Tidings speaks HTTP/1.1 alone, on this protocol: a request asking to
    upgrade (to ``h2c``, to a WebSocket) is answered as the HTTP/1.1 request
    it is (RFC 9110 §7.8 lets a server ignore ``Upgrade``), and HTTP/2's
    preface (``PRI * HTTP/2.0``) is a method Tidings does not implement.
    hypercorn switched protocols there, to code paths that the limits and
    checks of this one do not cover.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.connection = _Connection(
            h11.SERVER, max_incomplete_event_size=self.config.h11_max_incomplete_size
        )
        server_send = self.send

        async def send(event: Any) -> None:
            if isinstance(event, Closed) and self._answer_under_way():
                return  # the connection closes when the answer is done
            await server_send(event)

        self.send = send

    def _answer_under_way(self) -> bool:
        """Whether the request now answered arrived whole and its answer is
        not done, while what followed it was refused (h11's ERROR)."""
        connection = self.connection
        return (connection.their_state is h11.ERROR
                and getattr(connection, "completed", False)
                and connection.our_state in (h11.SEND_RESPONSE, h11.SEND_BODY))

    async def _check_protocol(self, event: h11.Request) -> None:
        """No switch of protocols (see the class): the request is HTTP/1.1."""

    async def _create_stream(self, request: h11.Request) -> None:
        status = None
        if head_size(request) > self.config.h11_max_incomplete_size:
            status = 431
        elif request.method not in IMPLEMENTED_METHODS:
            # A method no route of Tidings has (PROPFIND, FOO) is not
            # implemented (501), where one it has elsewhere is 405; and a
            # lower-case one is no method Tidings has: hypercorn would
            # upper-case it, and a router take "post" for POST, which a filter
            # in front checking for POST would not.
            status = 501
        elif not target_is_valid(request.method, request.target):
            status = 400
        if status is not None:
            await self._send_error_response(status)
            await self.send(Closed())
            return  # no stream: the loop reading this connection stops
        if any(name == b"upgrade" for name, _ in request.headers):
            # hypercorn would open a WebSocket on it: the request goes on
            # without the header. h11 holds what follows until the answer,
            # which, not being 101, refuses the switch.
            request = h11.Request(
                method=request.method, target=request.target, http_version=request.http_version,
                headers=[(n, v) for n, v in request.headers.raw_items() if n.lower() != b"upgrade"],
            )
        await super()._create_stream(request)

    async def _send_error_response(self, status_code: int) -> None:
        if self._answer_under_way():
            # Bytes after the whole request: its response goes out, then the
            # connection closes (our state DONE, theirs not: no next cycle).
            return
        if self.connection.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            # A response is under way or sent already (an answer given before
            # the body had arrived, whose client then hung up mid-body): there
            # is nothing to answer, and writing now would interleave with that
            # response's own send. The connection closes.
            return
        try:
            await self._send_envelope(status_code)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError,
                h11.LocalProtocolError):
            pass  # the client is gone or the connection is done: nothing to tell

    async def _send_envelope(self, status_code: int) -> None:
        message = MESSAGES.get(status_code, "the request cannot be processed")
        # 501 is the request's doing (a method or coding not implemented), not a fault.
        body = error_body(
            "INTERNAL_ERROR" if status_code >= 500 and status_code != 501 else "BAD_REQUEST",
            message.format(limit=self.config.h11_max_incomplete_size),
        )
        rid = choose_request_id(None)
        log_access("-", "(unread)", status_code, 0.0, None, rid)
        observe = getattr(self.config, CONFIG_OBSERVE, None)
        if observe is not None:
            observe("-", "(unread)", status_code)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
            # As every response; the request's own id is not read from a
            # request that could not be read.
            (b"x-request-id", rid.encode()),
        ]
        await self._send_h11_event(
            h11.Response(
                status_code=status_code,
                headers=list(chain(headers, self.config.response_headers("h11"))),
            )
        )
        # The answer to a HEAD has no body (h11 refuses one, and the status
        # line, held back to go out with it, was lost).
        if getattr(self.connection, "_request_method", None) != b"HEAD":
            await self._send_h11_event(h11.Data(data=body))
        await self._send_h11_event(h11.EndOfMessage())

