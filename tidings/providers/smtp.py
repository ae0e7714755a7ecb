"""The SMTP email provider (``TIDINGS_EMAIL_PROVIDER=smtp``, ``TIDINGS_SMTP_URL``).

Messages go to one relay over a pool of persistent connections
(``TIDINGS_SMTP_CONNECTIONS``), each reused for message after message and
replaced when it fails. A worker thread builds the MIME message and signs
it with the domain's DKIM key (OpenSSL's RSA releases the GIL, so signing
runs beside the event loop); the SMTP transaction runs on trio sockets, the
envelope pipelined when the server offers PIPELINING. ``docs/email.md`` has
the measurements behind that choice.

One transaction per recipient, each with the recipient's own bounce
address as ``MAIL FROM`` (``tidings.email.bounce_addresses``) and the same
signed bytes; the transactions of one email follow one another on one
connection. Per recipient: accepted after the message → ``sent``; a 5xx at
RCPT or at DATA → ``bounced``; a 5xx to MAIL FROM (the relay refuses the sender) →
``failed``; a 4xx anywhere, a timeout or a lost connection → deferred, for
the worker to retry with backoff.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from email.utils import parseaddr
from uuid import UUID

import trio

from tidings.config import Config, SmtpUrl
from tidings.email import smtp_client
from tidings.email.mime import build_message, message_id
from tidings.email.signing import sign
from tidings.email.smtp_client import Reply, SmtpConnection, SmtpConnectionError, Transaction
from tidings.providers.email import (
    Deferral,
    EmailOutcome,
    EmailProvider,
    EmailResult,
    OutgoingEmail,
    Progress,
)

log = logging.getLogger("tidings.emails")

NAME = "smtp"
# A pooled connection idle longer than this is replaced rather than reused:
# servers drop idle clients after a few minutes (RFC 5321 asks for 5).
IDLE_SECONDS = 60.0
# Worker threads that build and sign messages at once, and messages per thread hop.
RENDER_THREADS = 2
RENDER_BATCH = 16
# An email whose html and text together are larger than this is built in a
# lane of its own, one at a time. Deriving the text part of a large html
# document takes seconds (about 50 µs an element); in the common lane a few
# such emails would hold both threads, and every other email, of every team,
# would wait behind them.
LARGE_BYTES = 64 * 1024
# How long one try of an email may hold its connection, recipient after
# recipient; the recipients left then are deferred to its next try.
EMAIL_SECONDS = 2 * smtp_client.SOCKET_TIMEOUT_SECONDS
OUT_OF_TIME = "not tried: the email's recipients took too long on this try"


def render(email: OutgoingEmail) -> bytes:
    """The message as it goes out: MIME, with a Message-ID on the sending
    domain, DKIM-signed when the email carries its domain's key."""
    domain = email.dkim.domain if email.dkim else parseaddr(email.sender)[1].rpartition("@")[2]
    message = build_message(
        email_id=email.message_id, domain=domain, sender=email.sender, to=email.to,
        subject=email.subject, cc=email.cc, reply_to=email.reply_to, html=email.html,
        text=email.text, headers=email.headers,
    )
    if email.dkim is not None:
        message = sign(message, email.dkim.domain, email.dkim.selector,
                       email.dkim.private_key_pem)
    return message


@dataclass
class _Job:
    email: OutgoingEmail
    done: trio.Event = field(default_factory=trio.Event)
    message: bytes | None = None
    error: Exception | None = None


def _render_all(emails: list[OutgoingEmail]) -> list[bytes | Exception]:
    found: list[bytes | Exception] = []
    for email in emails:
        try:
            found.append(render(email))
        except Exception as error:  # one bad email fails alone
            found.append(error)
    return found


class Renderer:
    """Renders messages in up to ``threads`` worker threads, as many as are
    waiting (up to ``batch``) per trip to a thread: a trip costs the event
    loop about as much CPU as building a message.

    Whoever waits for a message takes a turn at rendering when a thread is
    free, until its own is done. A trip cut short (a shutdown, a lost
    lease) is left to finish in its thread and its results dropped
    (rendering changes nothing), and its messages wait for the next turn:
    nobody waits on a large message being built once they are cancelled."""

    def __init__(self, threads: int, batch: int = RENDER_BATCH) -> None:
        self._threads = threads
        self._batch = batch
        self._running = 0
        self._queue: list[_Job] = []
        self._turn = trio.Event()

    async def render(self, email: OutgoingEmail) -> bytes:
        job = _Job(email)
        self._queue.append(job)
        try:
            while not job.done.is_set():
                if self._running < self._threads and self._queue:
                    await self._trip()
                else:
                    await self._turn.wait()
        finally:
            if not job.done.is_set() and job in self._queue:
                self._queue.remove(job)  # given up before it was rendered
        if job.error is not None:
            raise job.error
        assert job.message is not None
        return job.message

    async def _trip(self) -> None:
        batch = self._queue[:self._batch]
        del self._queue[:self._batch]
        self._running += 1
        try:
            made = await trio.to_thread.run_sync(
                _render_all, [job.email for job in batch], abandon_on_cancel=True
            )
        except BaseException:
            # Cut short: the others of the batch wait for another turn.
            self._queue[:0] = batch
            raise
        finally:
            self._running -= 1
            self._turn.set()
            self._turn = trio.Event()
        for job, result in zip(batch, made, strict=True):
            if isinstance(result, Exception):
                job.error = result
            else:
                job.message = result
            job.done.set()


def _outcome(recipient: str, kind: str, reply: Reply) -> EmailOutcome:
    return EmailOutcome(recipient, kind, code=str(reply.code), message=reply.text)  # type: ignore[arg-type]


def _deferral(recipient: str, reply: Reply) -> Deferral:
    return Deferral(recipient, str(reply.code), reply.text)


def result_of(
    transaction: Transaction, recipients: tuple[str, ...], provider_message_id: str
) -> EmailResult:
    """Each recipient's outcome from the replies of its transaction."""
    outcomes: list[EmailOutcome] = []
    deferred: list[Deferral] = []
    for recipient in recipients:
        mail = transaction.mail
        reply = transaction.recipients.get(recipient)
        if mail is not None and not mail.positive:
            if mail.permanent:
                outcomes.append(_outcome(recipient, "failed", mail))
            else:
                deferred.append(_deferral(recipient, mail))
            continue
        if reply is None:
            deferred.append(Deferral(recipient, None, "not tried: the transaction ended early"))
            continue
        if reply.positive:
            reply = transaction.data or transaction.final or reply
        if reply.positive:
            outcomes.append(_outcome(recipient, "sent", reply))
        elif reply.permanent:
            outcomes.append(_outcome(recipient, "bounced", reply))
        else:
            deferred.append(_deferral(recipient, reply))
    return EmailResult(NAME, provider_message_id, tuple(outcomes), tuple(deferred))


def _closing(transaction: Transaction) -> bool:
    """421: the server is closing the channel."""
    replies = [transaction.mail, transaction.data, transaction.final,
               *transaction.recipients.values()]
    return any(reply is not None and reply.code == 421 for reply in replies)


class SmtpProvider:
    """Sends through one relay over at most ``connections`` pooled connections."""

    name = NAME
    verifies_domains_instantly = False

    def __init__(
        self,
        url: SmtpUrl,
        helo_name: str,
        *,
        connections: int = 8,
        tls_context: ssl.SSLContext | None = None,
        email_seconds: float = EMAIL_SECONDS,
    ) -> None:
        self.url = url
        self.helo_name = helo_name
        self.tls_context = tls_context or ssl.create_default_context()
        self._slots = trio.CapacityLimiter(connections)
        self._shares: dict[UUID, trio.CapacityLimiter] = {}
        self.email_seconds = email_seconds
        # Building and signing (CPU; OpenSSL's RSA runs without the GIL).
        self._renderer = Renderer(RENDER_THREADS)
        self._large_renderer = Renderer(1, batch=1)
        self._idle: list[tuple[SmtpConnection, float]] = []
        self._stale: list[SmtpConnection] = []
        # Connections opened so far: tests and metrics see reuse with it.
        self.connections_opened = 0

    async def send(self, email: OutgoingEmail, progress: Progress | None = None) -> EmailResult:
        """One transaction per recipient, each from its own bounce address,
        with the same signed message (DKIM does not cover the envelope), one
        after another on one pooled connection; each kept in ``progress`` as
        soon as it ends."""
        progress = Progress() if progress is None else progress
        size = len(email.html or "") + len(email.text or "")
        lane = self._large_renderer if size > LARGE_BYTES else self._renderer
        message = await lane.render(email)
        domain = email.dkim.domain if email.dkim else parseaddr(email.sender)[1].rpartition("@")[2]
        reference = message_id(email.message_id, domain)
        progress.provider_message_id = reference
        outcomes, deferred = progress.outcomes, progress.deferred
        async with self._team_share(email.team_id), self._slots:
            # Only _transact awaits with it, and closes it when cut short.
            conn: SmtpConnection | None = None
            budget = trio.current_time() + self.email_seconds
            for position, recipient in enumerate(email.recipients):
                if not progress.may_begin():
                    progress.stopped = True  # another process may be sending it now
                    break
                if trio.current_time() >= budget:
                    # Recipients whose servers answer slowly (a tarpit) hold
                    # the connection no longer: the rest wait for the next try.
                    deferred.extend(Deferral(r, None, OUT_OF_TIME)
                                    for r in email.recipients[position:])
                    break
                conn, done = await self._transact(
                    conn, email.return_paths[recipient], recipient, message
                )
                if isinstance(done, Transaction):
                    result = result_of(done, (recipient,), reference)
                    outcomes.extend(result.outcomes)
                    deferred.extend(result.deferred)
                    continue
                error, connecting = done
                # Not connected at all: the others would wait for the same.
                rest = email.recipients[position:] if connecting else (recipient,)
                code = None if error.reply is None else str(error.reply.code)
                deferred.extend(Deferral(r, code, str(error)) for r in rest)
                if connecting:
                    break
            if conn is not None:
                await self._give_back(conn)
        return EmailResult(NAME, reference, tuple(outcomes), tuple(deferred))

    @asynccontextmanager
    async def _team_share(self, team_id: UUID) -> AsyncIterator[None]:
        """A place among the at most half of the connections one team may
        hold at once (all of them when there is one): a team whose
        recipients' servers answer slowly cannot hold up every other team's mail."""
        share = self._shares.get(team_id)
        if share is None:
            share = self._shares[team_id] = trio.CapacityLimiter(
                max(1, int(self._slots.total_tokens) // 2)
            )
        try:
            async with share:
                yield
        finally:
            if share.borrowed_tokens == 0 and not share.statistics().tasks_waiting:
                self._shares.pop(team_id, None)

    async def _transact(
        self, conn: SmtpConnection | None, mail_from: str, recipient: str, message: bytes
    ) -> tuple[SmtpConnection | None, Transaction | tuple[SmtpConnectionError, bool]]:
        """One transaction on ``conn`` (None: a pooled or a new connection).
        Returns the connection to go on with (None: closed) and the
        transaction, or the error and whether it came from connecting."""
        reused = conn is not None
        if conn is None:
            conn, reused = self._take_idle()
        for first_try in (True, False):
            if conn is None:
                try:
                    conn = await smtp_client.connect(self.url, self.helo_name, self.tls_context)
                except SmtpConnectionError as error:
                    return None, (error, True)
                self.connections_opened += 1
            try:
                transaction = await smtp_client.send(conn, mail_from, [recipient], message)
            except SmtpConnectionError as error:
                await conn.aclose()
                conn = None
                # A pooled connection the server had dropped: nothing of this
                # transaction happened, so a fresh one may try it.
                if first_try and reused and not error.answered:
                    continue
                return None, (error, False)
            except BaseException:
                # Cut short (cancelled) mid-dialogue: the connection is unusable.
                await conn.aclose()
                raise
            if _closing(transaction):
                await conn.aclose()
                return None, transaction
            return conn, transaction
        raise AssertionError("unreachable")  # pragma: no cover

    def _take_idle(self) -> tuple[SmtpConnection | None, bool]:
        now = time.monotonic()
        while self._idle:
            conn, since = self._idle.pop()
            if now - since < IDLE_SECONDS:
                return conn, True
            self._stale.append(conn)
        return None, False

    async def _give_back(self, conn: SmtpConnection) -> None:
        self._idle.append((conn, time.monotonic()))
        while self._stale:
            await smtp_client.quit(self._stale.pop())

    async def aclose(self) -> None:
        """Say QUIT on every idle connection."""
        idle, self._idle = self._idle, []
        stale, self._stale = self._stale, []
        for conn in [c for c, _ in idle] + stale:
            await smtp_client.quit(conn)


@asynccontextmanager
async def open_smtp_provider(
    config: Config, *, tls_context: ssl.SSLContext | None = None
) -> AsyncIterator[SmtpProvider]:
    if config.smtp_url is None:
        raise ValueError("TIDINGS_EMAIL_PROVIDER=smtp needs TIDINGS_SMTP_URL")
    provider = SmtpProvider(
        config.smtp_url, config.mail_host, connections=config.smtp_connections,
        tls_context=tls_context,
    )
    try:
        yield provider
    finally:
        with trio.move_on_after(5, shield=True):
            await provider.aclose()


@asynccontextmanager
async def open_provider(config: Config) -> AsyncIterator[EmailProvider]:
    """The opener ``tidings.providers.select`` names for ``smtp``."""
    if not config.public_url.lower().startswith("https://"):
        log.warning(
            "TIDINGS_PUBLIC_URL is %s, not https: broadcast emails carry one-click "
            "unsubscribe links that mailbox providers ignore unless they are https "
            "(RFC 8058 §3.1)", config.public_url,
        )
    async with open_smtp_provider(config) as provider:
        yield provider
