"""The SMS provider interface: what a send worker hands over and what it gets back.

Like email (``tidings.providers.email``), a send answers with the status now
and, where the provider knows them in advance (the sandbox), the statuses and
replies that follow, each ``after`` a delay; the worker writes the later ones
as due work in PostgreSQL. A real provider (Twilio's Messages API) reports
later statuses by status callback or when asked (``fetch``, for
``POST /sms/{id}/sync``). Throttling (HTTP 429) or an unreachable API is a
``retry`` of the whole send, not a failure.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Literal, Protocol
from uuid import UUID

# The spec's SMS statuses (``last_event``); CONTRACT §8 orders them.
SmsStatus = Literal[
    "queued", "processing", "submitted", "sent", "delivered", "undelivered",
    "rejected", "failed", "expired", "unknown", "canceled",
]
SMS_STATUSES: tuple[SmsStatus, ...] = (
    "queued", "processing", "submitted", "sent", "delivered", "undelivered",
    "rejected", "failed", "expired", "unknown", "canceled",
)
SenderIdType = Literal["alphanumeric", "long_code", "short_code"]
SenderIdDecision = Literal["approved", "pending", "rejected"]

NOW = timedelta(0)

# The longest wait a provider's ``Retry-After`` may ask for: beyond it a
# message is tried again after a day all the same (docs/sms.md). A bound
# keeps a provider's answer within the dates a moment can have.
MAX_RETRY_AFTER = timedelta(days=1)


@dataclass(frozen=True)
class OutgoingSms:
    """One text message as a provider sends it. ``to`` is E.164; ``sender`` an
    approved sender ID of the team; ``status_callback`` the URL the provider
    reports statuses to (built on ``TIDINGS_PUBLIC_URL``), if any."""

    message_id: UUID
    team_id: UUID
    to: str
    sender: str
    body: str
    status_callback: str | None = None


@dataclass(frozen=True)
class SmsUpdate:
    """A status of the message, ``after`` the send returned (0: now).
    ``code``/``message`` are the provider's error code and text, if any."""

    status: SmsStatus
    after: timedelta = NOW
    code: str | None = None
    message: str | None = None


@dataclass(frozen=True)
class InboundSms:
    """A message the recipient sends back, ``after`` the send returned
    (``STOP`` opts the number out, CONTRACT §6)."""

    sender: str
    recipient: str
    body: str
    after: timedelta = NOW


class ProviderUnavailable(Exception):
    """The provider did not answer a question usefully now: ask again, not
    before ``retry_after`` when it said so."""

    def __init__(self, message: str, retry_after: timedelta | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class AnswerLost(Exception):
    """A send's request went out and its answer did not come back (no
    answer in time, the connection closed, a broken answer): the provider
    may have taken the message. Raised by ``send``; the message is not sent
    again (``texts_people``)."""


@dataclass(frozen=True)
class Retry:
    """The provider did not take the message now (429, 5xx, unreachable):
    send it again, not before ``after`` when the provider said so (at most
    ``MAX_RETRY_AFTER``)."""

    code: str | None
    message: str
    after: timedelta | None = None


@dataclass(frozen=True)
class SmsResult:
    """The answer to one send: ``retry`` set and nothing else, or the provider's
    message id and at least one update with ``after == 0``."""

    provider: str
    provider_message_id: str | None
    updates: tuple[SmsUpdate, ...] = ()
    inbound: tuple[InboundSms, ...] = ()
    retry: Retry | None = None

    def now(self) -> tuple[SmsUpdate, ...]:
        """The statuses to record in the attempt's own transaction, in order."""
        return tuple(u for u in self.updates if u.after <= NOW)

    def later(self) -> tuple[SmsUpdate, ...]:
        """The statuses to write as due work, in the order they fall due."""
        return tuple(sorted((u for u in self.updates if u.after > NOW), key=lambda u: u.after))


class SmsProvider(Protocol):
    """Where text messages go: ``sandbox`` or ``twilio`` (``TIDINGS_SMS_PROVIDER``)."""

    @property
    def name(self) -> str:
        ...

    @property
    def approves_sender_ids_instantly(self) -> bool:
        """True when every sender ID is approved at creation without asking."""
        ...

    @property
    def texts_people(self) -> bool:
        """True when a send reaches a phone: a send whose answer is lost is
        then never made again (``tidings.actors.sms``)."""
        ...

    async def review_sender_id(self, value: str, type: SenderIdType) -> SenderIdDecision:
        """The decision on a new sender ID (Twilio: does the account own the number)."""
        ...

    async def send(self, sms: OutgoingSms) -> SmsResult:
        """Hand ``sms`` over. Cancelled midway, or raising ``AnswerLost``, the
        provider may have taken it without a result: the caller must not
        send it again (``texts_people``)."""
        ...

    async def fetch(self, provider_message_id: str) -> SmsUpdate | None:
        """The message's current status at the provider (``after`` is 0); None if
        the provider does not know the id. Raises ``ProviderUnavailable``, or
        anything else, when it cannot tell now."""
        ...
