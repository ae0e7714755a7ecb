"""An SMTP client connection on trio sockets (RFC 5321, STARTTLS RFC 3207, AUTH RFC 4954).

One ``SmtpConnection`` carries any number of mail transactions, one at a
time. A transaction answers for each recipient with the server's reply;
replies decide, not exceptions. ``SmtpConnectionError`` means the connection
is unusable (closed, reset, garbled, refused at greeting or EHLO), and says
whether the server had answered anything of the transaction, which tells a
caller whether a retry on a fresh connection can send twice.

Callers bound the time of each call with a cancel scope; cancelled midway,
the connection is in an unknown state and must be closed.
"""

from __future__ import annotations

import base64
import ssl
from dataclasses import dataclass, field

import trio

from tidings.config import SmtpUrl

MAX_LINE = 8192


@dataclass(frozen=True)
class Reply:
    code: int
    text: str

    @property
    def positive(self) -> bool:
        return 200 <= self.code < 400

    @property
    def permanent(self) -> bool:
        return self.code >= 500

    def __str__(self) -> str:
        return f"{self.code} {self.text}"


class SmtpConnectionError(Exception):
    """The connection cannot carry on. ``answered``: the server had replied to
    a command of the current transaction (so part of it may have taken effect)."""

    def __init__(self, message: str, *, answered: bool = False, reply: Reply | None = None):
        super().__init__(message)
        self.answered = answered
        self.reply = reply


@dataclass
class Transaction:
    """The replies of one mail transaction."""

    mail: Reply | None = None
    recipients: dict[str, Reply] = field(default_factory=dict)
    data: Reply | None = None  # the reply to DATA, when it was not 354
    final: Reply | None = None  # the reply to the message


def dot_stuffed(message: bytes) -> bytes:
    """The DATA payload: CRLF line ends, leading dots doubled, ending in CRLF.CRLF."""
    if not message.endswith(b"\r\n"):
        message += b"\r\n"
    if message.startswith(b"."):
        message = b"." + message
    return message.replace(b"\r\n.", b"\r\n..") + b".\r\n"


class SmtpConnection:
    def __init__(self, stream: trio.abc.Stream, host: str) -> None:
        self._stream = stream
        self._host = host
        self._buffer = bytearray()
        self.extensions: dict[str, str] = {}
        self.transactions = 0
        self.last_used = trio.current_time()

    # --- low level --------------------------------------------------------

    async def _read_line(self) -> bytes:
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0:
                line = bytes(self._buffer[: end + 1])
                del self._buffer[: end + 1]
                return line.rstrip(b"\r\n")
            if len(self._buffer) > MAX_LINE:
                raise SmtpConnectionError("the server sent a line longer than 8 KiB")
            try:
                chunk = await self._stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as error:
                raise SmtpConnectionError(f"connection lost: {error}") from error
            if not chunk:
                raise SmtpConnectionError("the server closed the connection")
            self._buffer += chunk

    async def read_reply(self) -> Reply:
        texts: list[str] = []
        while True:
            line = await self._read_line()
            separator = line[3:4]
            if len(line) < 3 or not line[:3].isdigit() or separator not in (b"", b" ", b"-"):
                raise SmtpConnectionError(f"not an SMTP reply: {line[:100]!r}")
            texts.append(line[4:].decode("utf-8", "replace"))
            if separator != b"-":
                return Reply(int(line[:3]), "\n".join(texts))

    async def _write(self, data: bytes) -> None:
        try:
            await self._stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as error:
            raise SmtpConnectionError(f"connection lost: {error}") from error

    async def command(self, line: str) -> Reply:
        await self._write(line.encode("utf-8") + b"\r\n")
        return await self.read_reply()

    # --- session ----------------------------------------------------------

    async def ehlo(self, name: str) -> None:
        reply = await self.command(f"EHLO {name}")
        if reply.code != 250:
            reply = await self.command(f"HELO {name}")
            if reply.code != 250:
                raise SmtpConnectionError(f"HELO refused: {reply}", reply=reply)
            self.extensions = {}
            return
        extensions: dict[str, str] = {}
        for line in reply.text.split("\n")[1:]:
            keyword, _, params = line.partition(" ")
            extensions[keyword.upper()] = params
        self.extensions = extensions

    async def starttls(self, context: ssl.SSLContext, name: str) -> None:
        reply = await self.command("STARTTLS")
        if reply.code != 220:
            raise SmtpConnectionError(f"STARTTLS refused: {reply}", reply=reply)
        tls = trio.SSLStream(self._stream, context, server_hostname=self._host)
        try:
            await tls.do_handshake()
        except (trio.BrokenResourceError, ssl.SSLError) as error:
            raise SmtpConnectionError(f"TLS handshake failed: {error}") from error
        self._stream = tls
        self._buffer.clear()
        await self.ehlo(name)

    async def login(self, username: str, password: str) -> None:
        methods = self.extensions.get("AUTH", "").upper().split()
        if "PLAIN" in methods or not methods:
            token = base64.b64encode(f"\0{username}\0{password}".encode()).decode()
            reply = await self.command(f"AUTH PLAIN {token}")
        elif "LOGIN" in methods:
            reply = await self.command("AUTH LOGIN")
            if reply.code == 334:
                reply = await self.command(base64.b64encode(username.encode()).decode())
            if reply.code == 334:
                reply = await self.command(base64.b64encode(password.encode()).decode())
        else:
            raise SmtpConnectionError(f"no AUTH method in common: the server offers {methods}")
        if reply.code != 235:
            raise SmtpConnectionError(f"authentication failed: {reply}", reply=reply)

    async def send(self, mail_from: str, recipients: list[str], message: bytes) -> Transaction:
        """One mail transaction. Recipients refused at RCPT are left out of the
        message; if none is accepted, the transaction is reset."""
        result = Transaction()
        answered = False
        try:
            result.mail = await self.command(f"MAIL FROM:<{mail_from}>")
            answered = True
            if not result.mail.positive:
                await self._reset()
                return result
            accepted = []
            for recipient in recipients:
                reply = await self.command(f"RCPT TO:<{recipient}>")
                result.recipients[recipient] = reply
                if reply.positive:
                    accepted.append(recipient)
            if not accepted:
                await self._reset()
                return result
            reply = await self.command("DATA")
            if reply.code != 354:
                result.data = reply
                await self._reset()
                return result
            await self._write(dot_stuffed(message))
            result.final = await self.read_reply()
            return result
        except SmtpConnectionError as error:
            error.answered = answered
            raise
        finally:
            self.transactions += 1
            self.last_used = trio.current_time()

    async def _reset(self) -> None:
        reply = await self.command("RSET")
        if reply.code != 250:
            raise SmtpConnectionError(f"RSET refused: {reply}", answered=True, reply=reply)

    async def quit(self) -> None:
        """Say goodbye and close; never raises for a connection already gone."""
        with trio.move_on_after(2):
            try:
                await self.command("QUIT")
            except SmtpConnectionError:
                pass
        await self.aclose()

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self._stream)


async def connect(url: SmtpUrl, helo_name: str, context: ssl.SSLContext) -> SmtpConnection:
    """A connection, greeted, EHLO said, TLS and AUTH as ``url`` asks.

    Raises SmtpConnectionError (OSError for a refused connection included).
    """
    try:
        tcp = await trio.open_tcp_stream(url.host, url.port)
    except OSError as error:
        raise SmtpConnectionError(f"cannot connect to {url.host}:{url.port}: {error}") from error
    stream: trio.abc.Stream = tcp
    if url.implicit_tls:
        stream = trio.SSLStream(tcp, context, server_hostname=url.host)
    connection = SmtpConnection(stream, url.host)
    try:
        greeting = await connection.read_reply()
        if greeting.code != 220:
            raise SmtpConnectionError(f"the server refused the session: {greeting}",
                                      reply=greeting)
        await connection.ehlo(helo_name)
        offered = "STARTTLS" in connection.extensions
        if url.starttls == "require" and not offered:
            raise SmtpConnectionError("starttls=require, and the server does not offer STARTTLS")
        if url.starttls in ("require", "auto") and offered:
            await connection.starttls(context, helo_name)
        if url.username is not None:
            await connection.login(url.username, url.password or "")
    except BaseException:
        await connection.aclose()
        raise
    return connection
