"""One SMTP client connection (``smtplib``, blocking: run it in a worker thread).

Chosen by measurement over a client on trio sockets and aiosmtplib on the
trio-asyncio bridge (``docs/email.md``): the SMTP dialogue is a few small
round trips per message, and a blocking socket in a thread that also builds
and signs the message costs the least CPU per message.

A transaction answers for each recipient with the server's reply; replies
decide, not exceptions. ``SmtpConnectionError`` means the connection is
unusable (closed, reset, timed out, refused at greeting, EHLO, STARTTLS or
AUTH) and says whether the server had answered anything of the transaction,
which tells a caller whether a retry on a fresh connection can send twice.
"""

from __future__ import annotations

import smtplib
import ssl
from dataclasses import dataclass, field

from tidings.config import SmtpUrl

# Every socket operation (connect, each command) gives up after this.
SOCKET_TIMEOUT_SECONDS = 60.0


@dataclass(frozen=True)
class Reply:
    code: int
    text: str

    @classmethod
    def of(cls, answer: tuple[int, bytes | str]) -> Reply:
        text = answer[1]
        return cls(answer[0], text.decode("utf-8", "replace") if isinstance(text, bytes) else text)

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


def connect(url: SmtpUrl, helo_name: str, context: ssl.SSLContext) -> smtplib.SMTP:
    """A connection, greeted, EHLO said, TLS and AUTH as ``url`` asks."""
    client: smtplib.SMTP | None = None
    try:
        # Given the host, smtplib connects at once (refusing a greeting other
        # than 220) and knows the name to check the server's certificate against.
        if url.implicit_tls:
            client = smtplib.SMTP_SSL(url.host, url.port, local_hostname=helo_name,
                                      context=context, timeout=SOCKET_TIMEOUT_SECONDS)
        else:
            client = smtplib.SMTP(url.host, url.port, local_hostname=helo_name,
                                  timeout=SOCKET_TIMEOUT_SECONDS)
        client.ehlo_or_helo_if_needed()
        offered = client.has_extn("starttls")
        if url.starttls == "require" and not offered:
            raise SmtpConnectionError("starttls=require, and the server does not offer STARTTLS")
        if url.starttls in ("require", "auto") and offered:
            client.starttls(context=context)
            client.ehlo()
        if url.username is not None:
            client.login(url.username, url.password or "")
        return client
    except smtplib.SMTPAuthenticationError as error:
        _close(client)
        reply = Reply.of((error.smtp_code, error.smtp_error))
        raise SmtpConnectionError(f"authentication failed: {reply}", reply=reply) from None
    except smtplib.SMTPResponseException as error:
        _close(client)
        reply = Reply.of((error.smtp_code, error.smtp_error))
        raise SmtpConnectionError(f"the server refused the session: {reply}",
                                  reply=reply) from None
    except (smtplib.SMTPException, ssl.SSLError, OSError) as error:
        _close(client)
        kind = "TLS failed" if isinstance(error, ssl.SSLError) else "cannot connect"
        raise SmtpConnectionError(f"{kind} ({url.host}:{url.port}): {error}") from None
    except BaseException:
        _close(client)
        raise


def _close(client: smtplib.SMTP | None) -> None:
    if client is not None:
        client.close()


def send(
    client: smtplib.SMTP, mail_from: str, recipients: list[str], message: bytes
) -> Transaction:
    """One mail transaction. Recipients refused at RCPT are left out of the
    message; when none is accepted the transaction is reset."""
    result = Transaction()
    answered = False
    try:
        result.mail = Reply.of(client.mail(mail_from))
        answered = True
        if not result.mail.positive:
            _reset(client)
            return result
        accepted = 0
        for recipient in recipients:
            reply = Reply.of(client.rcpt(recipient))
            result.recipients[recipient] = reply
            accepted += reply.positive
        if not accepted:
            _reset(client)
            return result
        try:
            result.final = Reply.of(client.data(message))
        except smtplib.SMTPDataError as refused:
            result.data = Reply.of((refused.smtp_code, refused.smtp_error))
            _reset(client)
        return result
    except (smtplib.SMTPException, OSError) as error:
        raise SmtpConnectionError(f"connection lost: {error}", answered=answered) from None


def _reset(client: smtplib.SMTP) -> None:
    code, text = client.rset()
    if code != 250:
        raise SmtpConnectionError(f"RSET refused: {code} {text!r}", answered=True)


def quit(client: smtplib.SMTP) -> None:
    """Say goodbye and close; never raises."""
    try:
        client.quit()
    except (smtplib.SMTPException, OSError):
        client.close()
