"""A lean HTTP/1.1 client for webhook attempts, on trio sockets.

An attempt is one ``POST`` whose request is built once, as one piece of bytes,
and written with one ``send_all``; the answer is read only as far as an
attempt needs (the status and the first 2 KiB of the body), and the
connection is kept for the next attempt when the answer was read to its end
within a small limit. ``https://`` goes through ``trio.SSLStream``.

Each endpoint actor has its own :class:`Pool`: keep-alive connections to its
endpoint's origin, opened through the :class:`~tidings.webhooks.safety.Guard`
(the name is resolved, every address vetted, and the connection goes to a
vetted address). The actor bounds how many attempts run at once, so the pool
keeps at most that many idle connections. Redirects are answers like any
other: never followed. The caller bounds the whole attempt with a timeout
(a cancel scope); a connection cut short that way is closed, never reused.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import urlsplit

import trio

from tidings.webhooks.safety import Guard, UnresolvableTarget, UnsafeTarget

# The most of a response head (status line and headers) read.
HEAD_LIMIT = 64 * 1024
# A body is read to its end (so that the connection can be kept) up to this
# many bytes; a longer one closes the connection after what the attempt keeps.
DRAIN_LIMIT = 64 * 1024
RECEIVE_SIZE = 65536


class AttemptError(Exception):
    """An attempt that got no usable answer; ``str()`` says why."""


class ConnectFailed(AttemptError):
    """No connection: refused, unreachable, a forbidden address, a failed TLS handshake."""


class ConnectionFailed(AttemptError):
    """The connection broke, or the answer was not HTTP/1.1."""


class UnsupportedUrl(AttemptError):
    """Not an ``http://`` or ``https://`` URL with a host."""


@dataclass(frozen=True)
class Target:
    """A webhook URL, split once into what a request needs."""

    scheme: str
    host: str  # without brackets
    port: int
    # The request line's target and the Host header, ready to send.
    request_target: bytes
    host_header: bytes

    @property
    def origin(self) -> tuple[str, str, int]:
        return (self.scheme, self.host, self.port)


@lru_cache(maxsize=4096)
def parse_target(url: str) -> Target:
    """Split ``url``; raises UnsupportedUrl."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        raise UnsupportedUrl(str(error)) from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise UnsupportedUrl(f"the scheme {parts.scheme!r} is not http or https")
    host = parts.hostname or ""
    if not host:
        raise UnsupportedUrl("no host")
    if port == 0:
        raise UnsupportedUrl("port 0")
    default = 443 if scheme == "https" else 80
    netloc_host = f"[{host}]" if ":" in host else host
    host_header = netloc_host if port in (None, default) else f"{netloc_host}:{port}"
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    # Checked on the URL as stored: urlsplit drops tabs and line breaks.
    if any(c <= " " or c == "\x7f" for c in url):
        raise UnsupportedUrl("the URL has white space or control characters in it")
    return Target(
        scheme, host, default if port is None else port, path.encode("ascii"),
        host_header.encode("ascii"),
    )


def request_bytes(target: Target, headers: list[tuple[bytes, bytes]], body: bytes) -> bytes:
    """A whole ``POST`` request: request line, headers, and body."""
    lines = [b"POST ", target.request_target, b" HTTP/1.1\r\nHost: ", target.host_header, b"\r\n"]
    for name, value in headers:
        lines += [name, b": ", value, b"\r\n"]
    lines += [b"Content-Length: ", str(len(body)).encode(), b"\r\n\r\n", body]
    return b"".join(lines)


@dataclass(frozen=True)
class Response:
    status: int
    # The first ``keep`` bytes of the body.
    body: bytes


class _Connection:
    def __init__(
        self, origin: tuple[str, str, int], stream: trio.abc.Stream, sock: trio.socket.SocketType
    ) -> None:
        self.origin = origin
        self.stream = stream
        self.socket = sock
        self.buffer = bytearray()
        self.idle_since = 0.0
        # Whether any byte of an answer came on this connection's current exchange.
        self.received = False

    async def _fill(self) -> None:
        data = await self.stream.receive_some(RECEIVE_SIZE)
        if not data:
            raise ConnectionFailed("the server closed the connection")
        self.received = True
        self.buffer += data

    async def read_until(self, mark: bytes, limit: int) -> bytes:
        start = 0
        while True:
            found = self.buffer.find(mark, start)
            if found >= 0:
                end = found + len(mark)
                piece = bytes(self.buffer[:end])
                del self.buffer[:end]
                return piece
            if len(self.buffer) > limit:
                raise ConnectionFailed("the response head is too long")
            start = max(0, len(self.buffer) - len(mark) + 1)
            await self._fill()

    async def read_line(self, limit: int) -> bytes:
        """One line without its end: CRLF, or a bare LF, which RFC 9112 §2.2
        lets a recipient take for one (some servers end their lines so)."""
        line = await self.read_until(b"\n", limit)
        return line[:-2] if line.endswith(b"\r\n") else line[:-1]

    async def read_head(self, limit: int) -> list[bytes]:
        """The lines of a response head, up to the empty line that ends it."""
        lines: list[bytes] = []
        left = limit
        while True:
            line = await self.read_line(left)
            if not line:
                return lines
            lines.append(line)
            left -= len(line) + 1
            if left <= 0:
                raise ConnectionFailed("the response head is too long")

    async def read_some(self, most: int) -> bytes:
        if not self.buffer:
            await self._fill()
        piece = bytes(self.buffer[:most])
        del self.buffer[:most]
        return piece


class _Body:
    """Reads a response body, keeping the first ``keep`` bytes."""

    def __init__(self, conn: _Connection, keep: int) -> None:
        self.conn = conn
        self.keep = keep
        self.kept = bytearray()
        self.read = 0

    async def take(self, count: int) -> bool:
        """Read ``count`` bytes; False when that passes the drain limit (stop reading)."""
        while count > 0:
            if self.read >= DRAIN_LIMIT:
                return False
            piece = await self.conn.read_some(min(count, DRAIN_LIMIT - self.read))
            room = self.keep - len(self.kept)
            if room > 0:
                self.kept += piece[:room]
            self.read += len(piece)
            count -= len(piece)
        return True

    async def until_closed(self) -> None:
        try:
            while await self.take(RECEIVE_SIZE):
                pass
        except ConnectionFailed:
            pass  # the end of a body framed by the connection's close

    async def chunked(self) -> bool:
        while True:
            line = await self.conn.read_line(1024)
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise ConnectionFailed("a bad chunk size in the response") from None
            if size == 0:
                # Trailers, up to the empty line.
                await self.conn.read_head(HEAD_LIMIT)
                return True
            if not await self.take(size):
                return False
            if await self.conn.read_line(2):
                raise ConnectionFailed("a chunk longer than its size in the response")


# RFC 9112 §4: ``HTTP/1.x``, and a status of exactly three digits ("0200" is none).
_VERSION = re.compile(rb"HTTP/1\.[0-9]")
_STATUS = re.compile(rb"[1-5][0-9][0-9]")


def _parse_head(lines: list[bytes]) -> tuple[int, bool, dict[bytes, bytes]]:
    """Status, whether HTTP/1.1, and the headers (lowercase names) of a response head."""
    parts = lines[0].split(b" ", 2) if lines else []
    if len(parts) < 2 or not _VERSION.fullmatch(parts[0]) or not _STATUS.fullmatch(parts[1]):
        raise ConnectionFailed("the answer is not HTTP/1.1")
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise ConnectionFailed("a malformed header in the response")
        key = name.strip().lower()
        value = value.strip()
        headers[key] = headers[key] + b", " + value if key in headers else value
    return int(parts[1]), parts[0] == b"HTTP/1.1", headers


async def _exchange(conn: _Connection, request: bytes, keep: int) -> tuple[Response, bool]:
    """Send ``request`` and read the answer; the response and whether to keep the connection."""
    await conn.stream.send_all(request)
    while True:
        status, http11, headers = _parse_head(await conn.read_head(HEAD_LIMIT))
        if status == 101:
            raise ConnectionFailed("the server switched protocols")
        if not 100 <= status < 200:
            break  # 1xx answers are interim: the real one follows
    tokens = {token.strip() for token in headers.get(b"connection", b"").lower().split(b",")}
    reusable = b"close" not in tokens if http11 else b"keep-alive" in tokens
    body = _Body(conn, keep)
    encoding = headers.get(b"transfer-encoding", b"").lower()
    length = headers.get(b"content-length")
    if status in (204, 304):
        pass
    elif encoding:
        if encoding.rsplit(b",", 1)[-1].strip() != b"chunked":
            await body.until_closed()
            reusable = False
        elif not await body.chunked():
            reusable = False
    elif length is not None:
        try:
            size = int(length)
        except ValueError:
            raise ConnectionFailed("a bad Content-Length in the response") from None
        if size < 0:
            raise ConnectionFailed("a bad Content-Length in the response")
        if size > DRAIN_LIMIT:
            await body.take(keep)
            reusable = False
        elif not await body.take(size):
            reusable = False
    else:
        await body.until_closed()
        reusable = False
    return Response(status, bytes(body.kept)), reusable


class Pool:
    """Keep-alive connections of one endpoint actor."""

    def __init__(
        self, guard: Guard, ssl_context: ssl.SSLContext, *, keep_idle: int,
        keepalive_seconds: float = 30.0,
    ) -> None:
        self._guard = guard
        self._ssl_context = ssl_context
        self._keep_idle = keep_idle
        self._keepalive_seconds = keepalive_seconds
        self._idle: list[_Connection] = []

    async def post(self, target: Target, request: bytes, *, keep: int) -> Response:
        """Send a whole request to ``target``; the answer, with the first ``keep`` body bytes.

        Raises AttemptError. A connection kept from an earlier attempt that
        turns out to be closed before any answer arrived is replaced by a new
        one, once.
        """
        conn = self._reuse(target)
        if conn is not None:
            try:
                return await self._attempt(conn, request, keep)
            except ConnectionFailed:
                if conn.received:
                    raise  # part of an answer came: the server saw the request
        return await self._attempt(await self._connect(target), request, keep)

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            await trio.aclose_forcefully(conn.stream)

    async def _attempt(self, conn: _Connection, request: bytes, keep: int) -> Response:
        kept = False
        try:
            try:
                response, reusable = await _exchange(conn, request, keep)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as error:
                raise ConnectionFailed(str(error) or type(error).__name__) from None
            if reusable and not conn.buffer and len(self._idle) < self._keep_idle:
                conn.idle_since = trio.current_time()
                conn.received = False
                self._idle.append(conn)
                kept = True
            return response
        finally:
            if not kept:
                await trio.aclose_forcefully(conn.stream)

    def _reuse(self, target: Target) -> _Connection | None:
        now = trio.current_time()
        while self._idle:
            conn = self._idle.pop()
            if (
                conn.origin == target.origin
                and now - conn.idle_since < self._keepalive_seconds
                # Readable while idle: closed by the server (or talking out of turn).
                and not conn.socket.is_readable()
            ):
                return conn
            conn.socket.close()
        return None

    async def _connect(self, target: Target) -> _Connection:
        try:
            addresses = await self._guard.addresses(target.host, target.port)
        except (UnsafeTarget, UnresolvableTarget) as refused:
            raise ConnectFailed(str(refused)) from None
        last: OSError | None = None
        for address in addresses:
            try:
                tcp = await trio.open_tcp_stream(address, target.port)
                break
            except OSError as error:
                last = error
        else:
            assert last is not None
            raise ConnectFailed(str(last) or type(last).__name__)
        stream: trio.abc.Stream = tcp
        if target.scheme == "https":
            tls = trio.SSLStream(
                tcp, self._ssl_context, server_hostname=target.host, https_compatible=True
            )
            try:
                await tls.do_handshake()
            except (trio.BrokenResourceError, ssl.SSLError) as error:
                await trio.aclose_forcefully(tcp)
                cause = error.__cause__ or error
                raise ConnectFailed(f"TLS handshake failed: {cause}") from None
            stream = tls
        return _Connection(target.origin, stream, tcp.socket)
