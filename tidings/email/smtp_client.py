"""One SMTP client connection on trio sockets, with PIPELINING (RFC 2920).

Chosen by measurement over ``smtplib`` in worker threads and aiosmtplib on
the trio-asyncio bridge (``docs/email.md``). When the server offers
PIPELINING, ``MAIL FROM``, every ``RCPT TO`` and ``DATA`` go out in one
write and their replies are read together, so a message costs two round
trips (the envelope, then the content) instead of three plus one per
recipient; a server that does not offer it gets one command at a time.

A transaction answers for each recipient with the server's reply; replies
decide, not exceptions. ``SmtpConnectionError`` means the connection is
unusable (closed, reset, timed out, refused at greeting, EHLO, STARTTLS or
AUTH) and says whether the server had answered anything of the transaction,
which tells a caller whether a retry on a fresh connection can send twice.

Addresses go out with their domains in ASCII (xn--) form. A local part
outside ASCII (in the envelope, or in the message's headers) needs SMTPUTF8
(RFC 6531): with a server that offers it, ``MAIL FROM:<...> SMTPUTF8`` (and
``BODY=8BITMIME`` when the headers hold one); without, nothing is sent and
the transaction answers a permanent ``553 5.6.7`` of its own to ``MAIL
FROM``, which fails every recipient with that reason. Nothing a caller
passes makes it raise an encoding error.
"""

from __future__ import annotations

import base64
import hmac
import re
import ssl
from dataclasses import dataclass, field

import trio

from tidings.addresses import wire_address
from tidings.config import SmtpUrl

# Connecting (greeting, EHLO, STARTTLS, AUTH included), and each exchange of
# a transaction (the envelope, the content), gives up after this.
SOCKET_TIMEOUT_SECONDS = 60.0
# A reply line longer than this (RFC 5321 allows 512 octets) ends the connection.
MAX_LINE = 4096
# "Service not available, closing transmission channel" (RFC 5321 §4.2.3).
CLOSING = 421
# A reply of more lines than this ends the connection too: EHLO's, the
# longest a relay sends, has a line per extension, a dozen or two.
MAX_REPLY_LINES = 200
_LEADING_DOT = re.compile(rb"^\.", re.MULTILINE)


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


_BROKEN = (OSError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError)


class _Lost(Exception):
    """The peer closed the connection or sent something that is not SMTP."""


class SmtpConnection:
    """A greeted connection: one command exchange at a time (not task-safe)."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self._buffer = bytearray()
        self.extensions: dict[str, str] = {}

    @property
    def pipelining(self) -> bool:
        return "pipelining" in self.extensions

    @property
    def smtputf8(self) -> bool:
        return "smtputf8" in self.extensions

    # No timeouts of their own: callers put one around each exchange.
    async def write(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def reply(self) -> Reply:
        """The next reply, all its lines (``250-...``, then ``250 ...``)."""
        lines: list[str] = []
        while True:
            end = self._buffer.find(b"\n")
            while end < 0:
                if len(self._buffer) > MAX_LINE:
                    raise _Lost("a reply line too long")
                chunk = await self.stream.receive_some(65536)
                if not chunk:
                    raise _Lost("the server closed the connection")
                self._buffer += chunk
                end = self._buffer.find(b"\n")
            line = bytes(self._buffer[:end]).rstrip(b"\r")
            del self._buffer[:end + 1]
            if len(line) < 3 or not line[:3].isdigit():
                raise _Lost(f"not an SMTP reply: {line[:80]!r}")
            lines.append(line[4:].decode("utf-8", "replace"))
            if len(lines) > MAX_REPLY_LINES:
                raise _Lost(f"a reply of more than {MAX_REPLY_LINES} lines")
            if line[3:4] != b"-":
                return Reply(int(line[:3]), "\n".join(lines))

    async def command(self, line: str) -> Reply:
        # UTF-8: only an address can be other than ASCII, and only with SMTPUTF8.
        await self.write(line.encode("utf-8", "replace") + b"\r\n")
        return await self.reply()

    async def hello(self, name: str) -> Reply:
        """EHLO (HELO when refused); the extensions the server offers."""
        reply = await self.command(f"EHLO {name}")
        self.extensions = {}
        if reply.code == 250:
            for line in reply.text.split("\n")[1:]:
                keyword, _, params = line.strip().partition(" ")
                self.extensions[keyword.lower()] = params
            return reply
        return await self.command(f"HELO {name}")

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)


def _envelope_address(address: str) -> str:
    """``<address>`` for MAIL FROM / RCPT TO, its domain in ASCII (xn--) form
    (IDNA 2008, as the headers have it)."""
    return f"<{wire_address(address.strip().strip('<>'))}>"


def _needs_smtputf8(mail: str, rcpts: list[str], message: bytes) -> list[str]:
    """What of the transaction is not ASCII: addresses, and the message's headers."""
    found = [line.partition(":")[2] for line in (mail, *rcpts) if not line.isascii()]
    if not message.isascii():
        found.append("the message's headers")
    return found


def _without_smtputf8(needing: list[str]) -> Reply:
    """The reply that stands for MAIL FROM when the server cannot take the
    transaction: 553 5.6.7, as a server answers a non-ASCII address (RFC 6531)."""
    return Reply(553, "5.6.7 not sent: SMTPUTF8 (RFC 6531) is needed for the characters "
                      f"outside ASCII in {', '.join(needing)}, and the SMTP server does not "
                      "offer it")


async def connect(url: SmtpUrl, helo_name: str, context: ssl.SSLContext) -> SmtpConnection:
    """A connection, greeted, EHLO said, TLS and AUTH as ``url`` asks."""
    streams: list[trio.abc.Stream] = []
    try:
        with trio.fail_after(SOCKET_TIMEOUT_SECONDS):
            return await _open(url, helo_name, context, streams)
    except SmtpConnectionError:
        await _close(streams)
        raise
    except (ssl.SSLError, trio.BrokenResourceError) as error:
        await _close(streams)
        cause = error.__cause__ if isinstance(error.__cause__, ssl.SSLError) else error
        kind = "TLS failed" if isinstance(cause, ssl.SSLError) else "cannot connect"
        raise SmtpConnectionError(f"{kind} ({url.host}:{url.port}): {cause}") from None
    except (*_BROKEN, _Lost) as error:
        await _close(streams)
        message = str(error) or type(error).__name__
        raise SmtpConnectionError(f"cannot connect ({url.host}:{url.port}): {message}") from None
    except BaseException:
        await _close(streams)
        raise


async def _open(
    url: SmtpUrl, helo_name: str, context: ssl.SSLContext, streams: list[trio.abc.Stream]
) -> SmtpConnection:
    """``connect``'s dialogue; every stream it opens goes into ``streams``."""
    # trio sets TCP_NODELAY: a pipelined group is one write, and it is awaited.
    stream: trio.abc.Stream = await trio.open_tcp_stream(url.host, url.port)
    streams.append(stream)
    if url.implicit_tls:
        stream = trio.SSLStream(stream, context, server_hostname=url.host)
        streams.append(stream)
        await stream.do_handshake()
    conn = SmtpConnection(stream)
    greeting = await conn.reply()
    if greeting.code != 220:
        raise SmtpConnectionError(f"the server refused the session: {greeting}", reply=greeting)
    await _hello(conn, helo_name)
    offered = "starttls" in conn.extensions
    if url.starttls == "require" and not offered:
        raise SmtpConnectionError("starttls=require, and the server does not offer STARTTLS")
    if url.starttls in ("require", "auto") and offered:
        reply = await conn.command("STARTTLS")
        if reply.code != 220:
            raise SmtpConnectionError(f"the server refused the session: {reply}", reply=reply)
        tls = trio.SSLStream(conn.stream, context, server_hostname=url.host)
        streams.append(tls)
        await tls.do_handshake()
        conn = SmtpConnection(tls)
        await _hello(conn, helo_name)
    if url.username is not None:
        await _authenticate(conn, url.username, url.password or "")
    return conn


async def _hello(conn: SmtpConnection, helo_name: str) -> None:
    reply = await conn.hello(helo_name)
    if reply.code != 250:
        raise SmtpConnectionError(f"the server refused the session: {reply}", reply=reply)


async def _close(streams: list[trio.abc.Stream]) -> None:
    if streams:
        await trio.aclose_forcefully(streams[-1])


async def _authenticate(conn: SmtpConnection, username: str, password: str) -> None:
    offered = conn.extensions.get("auth", "").upper().split()
    user, secret = username.encode(), password.encode()
    if "CRAM-MD5" in offered:
        reply = await conn.command("AUTH CRAM-MD5")
        if reply.code == 334:
            challenge = base64.b64decode(reply.text.strip())
            digest = hmac.new(secret, challenge, "md5").hexdigest().encode()
            reply = await conn.command(base64.b64encode(user + b" " + digest).decode())
    elif "PLAIN" in offered:
        token = base64.b64encode(b"\0" + user + b"\0" + secret).decode()
        reply = await conn.command(f"AUTH PLAIN {token}")
    elif "LOGIN" in offered:
        reply = await conn.command("AUTH LOGIN")
        if reply.code == 334:
            reply = await conn.command(base64.b64encode(user).decode())
        if reply.code == 334:
            reply = await conn.command(base64.b64encode(secret).decode())
    else:
        raise SmtpConnectionError("authentication failed: the server offers no AUTH "
                                  "mechanism Tidings knows (CRAM-MD5, PLAIN, LOGIN)")
    if reply.code != 235:
        raise SmtpConnectionError(f"authentication failed: {reply}", reply=reply)


def _dot_stuffed(message: bytes) -> bytes:
    if not message.endswith(b"\r\n"):
        message += b"\r\n"
    if message.startswith(b".") or b"\n." in message:
        message = _LEADING_DOT.sub(b"..", message)
    return message + b".\r\n"


async def send(
    conn: SmtpConnection, mail_from: str, recipients: list[str], message: bytes
) -> Transaction:
    """One mail transaction. Recipients refused at RCPT are left out of the
    message; when none is accepted the transaction is reset."""
    result = Transaction()
    answered = False
    mail = f"MAIL FROM:{_envelope_address(mail_from)}"
    rcpts = [f"RCPT TO:{_envelope_address(r)}" for r in recipients]
    needing = _needs_smtputf8(mail, rcpts, message)
    if needing and not conn.smtputf8:
        result.mail = _without_smtputf8(needing)
        return result
    if needing:
        # UTF-8 headers are 8-bit content (RFC 6152), which SMTPUTF8 servers take.
        mail += " BODY=8BITMIME SMTPUTF8" if not message.isascii() else " SMTPUTF8"
    try:
        with trio.fail_after(SOCKET_TIMEOUT_SECONDS):
            # A 421 ends the dialogue: the server closes the channel after it
            # (RFC 5321 §3.8), and it is the reply to record.
            if conn.pipelining:
                # One write for the envelope and DATA; the replies come in order.
                group = "".join(f"{c}\r\n" for c in (mail, *rcpts, "DATA"))
                await conn.write(group.encode("utf-8", "replace"))
                result.mail = await conn.reply()
                answered = True
                if result.mail.code == CLOSING:
                    return result
                for recipient in recipients:
                    reply = result.recipients[recipient] = await conn.reply()
                    if reply.code == CLOSING:
                        return result
                data = await conn.reply()
            else:
                result.mail = await conn.command(mail)
                answered = True
                if result.mail.code == CLOSING:
                    return result
                if not result.mail.positive:
                    await _reset(conn)
                    return result
                for recipient, line in zip(recipients, rcpts, strict=True):
                    reply = result.recipients[recipient] = await conn.command(line)
                    if reply.code == CLOSING:
                        return result
                if not any(r.positive for r in result.recipients.values()):
                    await _reset(conn)
                    return result
                data = await conn.command("DATA")
        accepted = result.mail.positive and any(r.positive for r in result.recipients.values())
        with trio.fail_after(SOCKET_TIMEOUT_SECONDS):
            if data.code == 354:
                # Nobody to send to (a pipelining server said 354 anyway): an empty message.
                await conn.write(_dot_stuffed(message) if accepted else b".\r\n")
                final = await conn.reply()
                if accepted:
                    result.final = final
                else:
                    await _reset(conn)
                return result
            if accepted or data.code == CLOSING:
                result.data = data
            if data.code != CLOSING:
                await _reset(conn)
            return result
    except (*_BROKEN, _Lost) as error:
        message_text = str(error) or type(error).__name__
        raise SmtpConnectionError(f"connection lost: {message_text}", answered=answered) from None


async def _reset(conn: SmtpConnection) -> None:
    reply = await conn.command("RSET")
    if reply.code != 250:
        raise SmtpConnectionError(f"RSET refused: {reply}", answered=True)


async def quit(conn: SmtpConnection) -> None:
    """Say goodbye and close; never raises."""
    with trio.move_on_after(5):
        try:
            await conn.command("QUIT")
        except (*_BROKEN, _Lost):
            pass
    await conn.aclose()
