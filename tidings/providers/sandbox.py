"""The sandbox providers: nothing leaves the process; outcomes follow CONTRACT §9.

Outcomes depend only on the recipient, so they are deterministic, and all of
them fall within 2 seconds of the send. The sandbox says at send time what
will happen later (``EmailOutcome.after``, ``SmsUpdate.after``,
``InboundSms.after``); the send worker writes those as due work in
PostgreSQL, exactly as it would for a real provider's late reports.

| recipient                                               | outcome                              |
|---------------------------------------------------------|--------------------------------------|
| email local part ``bounced``/``complained``/``failed``   | sent, then that outcome               |
| email local part ``delayed``                             | sent, delivery_delayed, delivered     |
|   (each also with a ``+tag``, case-insensitive)          |                                      |
| any other email                                          | sent, then delivered                  |
| number ending in 0001                                    | submitted, sent, undelivered          |
| number ending in 0002                                    | submitted, failed (carrier rejected)  |
| number ending in 0003                                    | submitted, sent, delivered, then STOP |
| any other number                                         | submitted, sent, delivered            |
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from email.utils import parseaddr

import trio

from tidings.config import Config
from tidings.providers.email import (
    NOW,
    EmailOutcome,
    EmailProvider,
    EmailResult,
    OutgoingEmail,
    Progress,
)
from tidings.providers.sms import (
    InboundSms,
    OutgoingSms,
    SenderIdDecision,
    SenderIdType,
    SmsProvider,
    SmsResult,
    SmsUpdate,
)

NAME = "sandbox"


def _s(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


# --- email -------------------------------------------------------------------

_SENT = ("250", "2.0.0 accepted by the sandbox")
_DELIVERED = ("250", "2.0.0 delivered to the sandbox mailbox")

# Local part (without +tag, lowercased) -> the outcomes after ``sent``.
_EMAIL_SCRIPTS: dict[str, tuple[tuple[str, float, str, str], ...]] = {
    "bounced": (("bounced", 1.0, "550", "5.1.1 mailbox does not exist (sandbox)"),),
    "complained": (("complained", 1.0, "abuse", "the recipient reported it as spam (sandbox)"),),
    "failed": (("failed", 1.0, "554", "5.3.0 delivery failed permanently (sandbox)"),),
    "delayed": (
        ("delivery_delayed", 0.5, "421", "4.4.7 delivery delayed, still trying (sandbox)"),
        ("delivered", 1.5, *_DELIVERED),
    ),
}
_EMAIL_DEFAULT = (("delivered", 1.0, *_DELIVERED),)


def email_script(recipient: str) -> str | None:
    """The §9 row ``recipient`` falls under: its local part without a ``+tag``,
    lowercased, if that names a scripted outcome; else None (delivered)."""
    address = parseaddr(recipient)[1] or recipient
    local, at, _domain = address.strip().rpartition("@")
    if not at:
        return None
    name = local.split("+", 1)[0].lower()
    return name if name in _EMAIL_SCRIPTS else None


def email_outcomes(recipient: str) -> tuple[EmailOutcome, ...]:
    """Everything that happens to ``recipient``, from ``sent`` on, in order."""
    script = email_script(recipient)
    steps = _EMAIL_DEFAULT if script is None else _EMAIL_SCRIPTS[script]
    outcomes = [EmailOutcome(recipient, "sent", NOW, *_SENT)]
    for kind, after, code, message in steps:
        outcomes.append(EmailOutcome(recipient, kind, _s(after), code, message))  # type: ignore[arg-type]
    return tuple(outcomes)


class SandboxEmail:
    """The default email provider (``TIDINGS_EMAIL_PROVIDER=sandbox``)."""

    name = NAME
    verifies_domains_instantly = True

    async def send(self, email: OutgoingEmail, progress: Progress | None = None) -> EmailResult:
        await trio.lowlevel.checkpoint()
        # Every recipient at once, after the one checkpoint: nothing to keep
        # in ``progress`` for a send cut short, which did nothing.
        return EmailResult(
            provider=NAME,
            provider_message_id=f"<{email.message_id}@sandbox.tidings.invalid>",
            outcomes=tuple(o for r in email.recipients for o in email_outcomes(r)),
        )


@asynccontextmanager
async def open_sandbox_email(config: Config) -> AsyncIterator[EmailProvider]:
    yield SandboxEmail()


# --- SMS ---------------------------------------------------------------------

_SUBMITTED = SmsUpdate("submitted", NOW)
_SMS_SCRIPTS: dict[str, tuple[SmsUpdate, ...]] = {
    "delivered": (_SUBMITTED, SmsUpdate("sent", _s(0.5)), SmsUpdate("delivered", _s(1.0))),
    "undelivered": (
        _SUBMITTED,
        SmsUpdate("sent", _s(0.5)),
        SmsUpdate("undelivered", _s(1.0), "30003", "unreachable destination handset (sandbox)"),
    ),
    "failed": (
        _SUBMITTED,
        SmsUpdate("failed", _s(0.5), "30007", "rejected by the carrier (sandbox)"),
    ),
}
_SMS_BY_ENDING = {"0001": "undelivered", "0002": "failed", "0003": "stop"}
STOP_AFTER = _s(1.5)


def sms_script(to: str) -> str:
    """The §9 row of a number: ``undelivered``, ``failed``, ``stop`` or ``delivered``."""
    digits = "".join(ch for ch in to if ch.isdigit())
    return _SMS_BY_ENDING.get(digits[-4:], "delivered")


def sms_updates(to: str) -> tuple[SmsUpdate, ...]:
    """The statuses of a message to ``to``, from ``submitted`` on, in order."""
    script = sms_script(to)
    return _SMS_SCRIPTS["delivered" if script == "stop" else script]


def sms_inbound(to: str, sender: str) -> tuple[InboundSms, ...]:
    """The replies the recipient sends: a ``STOP`` from numbers ending in 0003."""
    if sms_script(to) != "stop":
        return ()
    return (InboundSms(sender=to, recipient=sender, body="STOP", after=STOP_AFTER),)


class SandboxSms:
    """The default SMS provider (``TIDINGS_SMS_PROVIDER=sandbox``).

    Its message ids say the script and the send time
    (``sandbox-<script>-<unix ms>-<message id>``), so that ``fetch`` answers
    what the status is by now without keeping anything in memory.
    """

    name = NAME
    approves_sender_ids_instantly = True
    texts_people = False  # a simulation: nothing reaches a phone

    def __init__(self, clock: Callable[[], datetime] | None = None) -> None:
        self._clock = clock or (lambda: datetime.now(UTC))

    async def review_sender_id(self, value: str, type: SenderIdType) -> SenderIdDecision:
        await trio.lowlevel.checkpoint()
        return "approved"

    async def send(self, sms: OutgoingSms) -> SmsResult:
        await trio.lowlevel.checkpoint()
        sent_ms = int(self._clock().timestamp() * 1000)
        return SmsResult(
            provider=NAME,
            provider_message_id=f"sandbox-{sms_script(sms.to)}-{sent_ms}-{sms.message_id.hex}",
            updates=sms_updates(sms.to),
            inbound=sms_inbound(sms.to, sms.sender),
        )

    async def fetch(self, provider_message_id: str) -> SmsUpdate | None:
        await trio.lowlevel.checkpoint()
        parts = provider_message_id.split("-")
        if len(parts) != 4 or parts[0] != NAME or not parts[2].isdigit():
            return None
        script = parts[1]
        if script not in _SMS_SCRIPTS and script != "stop":
            return None
        elapsed = self._clock() - datetime.fromtimestamp(int(parts[2]) / 1000, UTC)
        steps = _SMS_SCRIPTS["delivered" if script == "stop" else script]
        current = steps[0]
        for update in steps:
            if update.after <= elapsed:
                current = update
        return SmsUpdate(current.status, NOW, current.code, current.message)


@asynccontextmanager
async def open_sandbox_sms(config: Config) -> AsyncIterator[SmsProvider]:
    yield SandboxSms()
