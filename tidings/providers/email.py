"""The email provider interface: what a send worker hands over and what it gets back.

A provider answers for each recipient at once and may announce what will
happen to it later (the sandbox knows its outcomes in advance; a real
provider learns of delays, bounces and complaints afterwards and reports
them through other paths). The worker records the immediate outcomes in the
transaction that completes the attempt and writes the later ones as due work
in PostgreSQL (due at ``now + outcome.after``), so that a crash loses none of
them. Deferred recipients are tried again by the worker with its own backoff.

Providers never raise for a delivery failure: a refused recipient is a
``bounced`` outcome, a temporary failure (an SMTP 4xx, an unreachable
server) is a ``Deferral``. An exception from ``send`` is a bug or a
cancellation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal, Protocol
from uuid import UUID

# The outcomes a provider can report; the worker records each as the email
# event of the same name (and the webhook event ``message.<type>``).
EmailOutcomeType = Literal[
    "sent", "delivered", "delivery_delayed", "bounced", "complained", "failed"
]
EMAIL_OUTCOME_TYPES: tuple[EmailOutcomeType, ...] = (
    "sent", "delivered", "delivery_delayed", "bounced", "complained", "failed"
)

NOW = timedelta(0)


@dataclass(frozen=True)
class DkimKey:
    """The sending domain's DKIM key: the provider signs every message with it."""

    domain: str
    selector: str
    private_key_pem: bytes = field(repr=False)


@dataclass(frozen=True)
class OutgoingEmail:
    """One email as a provider sends it.

    ``sender`` is the From header (``"Acme <news@acme.test>"``);
    ``return_paths`` the envelope sender (MAIL FROM) of each recipient, its
    own bounce address on the sending domain's return-path host
    (``tidings.email.bounce_addresses``): a provider sends one transaction
    per recipient. ``recipients`` is every envelope recipient (to, cc and bcc,
    bare addresses) of this attempt, which may be fewer than the headers name
    when some were suppressed, already done, or are being retried. The
    provider builds the MIME message (a text part derived from ``html`` when
    ``text`` is None), adds ``Message-ID: <{message_id}@{dkim.domain}>`` and
    signs it with ``dkim`` when given.
    """

    message_id: UUID
    team_id: UUID
    sender: str
    return_paths: Mapping[str, str]
    recipients: tuple[str, ...]
    to: tuple[str, ...]
    subject: str
    cc: tuple[str, ...] = ()
    reply_to: tuple[str, ...] = ()
    html: str | None = None
    text: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    dkim: DkimKey | None = None


@dataclass(frozen=True)
class EmailOutcome:
    """What happens to one recipient, ``after`` the send returned.

    ``code`` and ``message`` are the provider's own status (an SMTP reply code
    and its text, for example) and go into the event's ``code``/``message``.
    """

    recipient: str
    type: EmailOutcomeType
    after: timedelta = NOW
    code: str | None = None
    message: str | None = None


@dataclass(frozen=True)
class Deferral:
    """A recipient the provider could not take now (SMTP 4xx, connection failure).

    The worker tries it again with backoff and records ``failed`` after its
    last try. ``retry_after`` is the provider's hint, when it gave one.
    """

    recipient: str
    code: str | None
    message: str
    retry_after: timedelta | None = None


@dataclass(frozen=True)
class EmailResult:
    """The answer to one send: every recipient of the attempt is in exactly one of
    ``outcomes`` (at least its immediate outcome, ``after == 0``) or ``deferred``."""

    provider: str
    # The provider's reference for the message (the Message-ID, a queue id), if any.
    provider_message_id: str | None
    outcomes: tuple[EmailOutcome, ...] = ()
    deferred: tuple[Deferral, ...] = ()

    def now(self) -> tuple[EmailOutcome, ...]:
        """The outcomes to record in the attempt's own transaction."""
        return tuple(o for o in self.outcomes if o.after <= NOW)

    def later(self) -> tuple[EmailOutcome, ...]:
        """The outcomes to write as due work, in the order they fall due."""
        return tuple(sorted((o for o in self.outcomes if o.after > NOW), key=lambda o: o.after))


@dataclass
class Progress:
    """What a send has done so far, kept by the provider as it goes: each
    recipient's outcome (or deferral) as soon as its transaction ends. A send
    cut short (cancelled) leaves here what it had done, so that the worker
    records it rather than sending those recipients the message again."""

    provider_message_id: str | None = None
    outcomes: list[EmailOutcome] = field(default_factory=list)
    deferred: list[Deferral] = field(default_factory=list)
    # Asked before each recipient's hand-over begins: False when the work
    # may have passed to another process meanwhile (its lease may have
    # ended while this one stalled). The provider then stops, ``stopped``
    # set, leaving the recipients not begun with no outcome at all.
    may_begin: Callable[[], bool] = lambda: True
    stopped: bool = False

    def done(self) -> set[str]:
        """The recipients with an outcome or a deferral."""
        return {o.recipient for o in self.outcomes} | {d.recipient for d in self.deferred}


class EmailProvider(Protocol):
    """Where emails go: ``sandbox`` or ``smtp`` (``TIDINGS_EMAIL_PROVIDER``)."""

    @property
    def name(self) -> str:
        """The event's ``provider``: ``sandbox`` or ``smtp``."""
        ...

    @property
    def verifies_domains_instantly(self) -> bool:
        """True when ``POST /domains/{id}/verify`` succeeds without DNS lookups."""
        ...

    async def send(self, email: OutgoingEmail, progress: Progress | None = None) -> EmailResult:
        """Hand ``email`` over, keeping in ``progress`` each recipient's
        outcome as it is known. Cancelled midway, the recipient whose
        transaction was under way may have been accepted without a result:
        the worker's retry may send it twice, which is the at-least-once
        every SMTP client has."""
        ...
