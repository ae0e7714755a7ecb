"""Emails of a team: the events every change of an email writes.

An email's ``status`` is the type of its last event. Every state change
writes, in one transaction: the email's row, its ``email_events`` row and
the webhook event ``message.<type>`` (``tidings.storage.events``), which
share one id. Acceptance is in ``tidings.storage.emails_accept``; the send
itself, and the outcomes reported after it, are in
``tidings.storage.emails_sending``.

Functions that write several statements expect to run inside the caller's
transaction.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from tidings.addresses import shown_parts
from tidings.ids import new_id
from tidings.storage.connection import Connection
from tidings.storage.events import FANOUT
from tidings.webhooks.catalogue import EVENT_TYPES

STATUSES: tuple[str, ...] = (
    "scheduled", "queued", "sent", "delivered", "delivery_delayed", "bounced",
    "complained", "failed", "suppressed", "canceled",
)
CHANNEL = "email"
# Every process LISTENs here; the payload is the id of a team with an email due now.
DUE_CHANNEL = "tidings_emails_due"

EMAIL_COLUMNS = """
id, team_id, from_address, from_email, to_addresses, cc, bcc, reply_to, subject, html, text,
headers, tags, status, scheduled_at, template_id, template_version_id, domain,
smtp_message_id, provider, attempt_count, last_error, created_at, updated_at
"""
EVENT_COLUMNS = "id, email_id, type, recipient, occurred_at, provider, code, message"

# State changes of emails, set-based: the email events and, with the same
# ids, the webhook events ``message.<type>`` and their deliveries. $1..$10:
# one array per column of ``change``.
CHANGE_ROWS = """
    SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::text[], $5::text[],
                         $6::timestamptz[], $7::text[], $8::text[], $9::text[], $10::jsonb[])
        AS c(id, email_id, team_id, type, recipient, occurred_at, provider, code, message, data)
"""
CHANGE = f"change AS ({CHANGE_ROWS})"
RECORDED = f"""
email_event AS (
    INSERT INTO email_events (id, email_id, team_id, type, recipient, occurred_at, provider,
                              code, message)
    SELECT id, email_id, team_id, type, recipient, occurred_at, provider, code, message
    FROM change
), event AS (
    INSERT INTO events (id, team_id, type, channel, message_id, recipient, occurred_at, data)
    SELECT id, team_id, 'message.' || type, '{CHANNEL}', email_id, recipient, occurred_at, data
    FROM change
    RETURNING id, team_id, type
), {FANOUT}"""

RECORD_CHANGES = f"WITH {CHANGE}, {RECORDED} SELECT woken FROM woken"

@dataclass(frozen=True)
class Change:
    """One state change of an email: its email event and its webhook event."""

    email_id: UUID
    team_id: UUID
    type: str
    recipient: str | None
    occurred_at: datetime
    provider: str | None
    data: dict[str, Any]
    code: str | None = None
    message: str | None = None
    id: UUID = field(default_factory=new_id)


def event_data(
    email_id: UUID, from_address: str, to: Sequence[str], subject: str, **more: Any
) -> dict[str, Any]:
    """The ``data`` of a webhook event about an email (as Resend sends it);
    ``_webhook_data`` completes it with the change's provider and status."""
    data = {"email_id": str(email_id), "from": from_address, "to": list(to), "subject": subject,
            "broadcast_id": None}
    data.update(more)
    return data


def recipients_text(addresses: Sequence[str]) -> str:
    """The ``to`` of an event about a whole email: its ``to`` addresses
    without their display names, comma-separated, so that for one recipient
    it reads as the events about that recipient do."""
    return ", ".join(address for _, address in shown_parts(addresses) if address)


class Clock:
    """Event times that keep their order within one write: each tick is one
    microsecond after the last, so events written together list in order."""

    def __init__(self) -> None:
        self._now = datetime.now(UTC)

    def tick(self) -> datetime:
        self._now += timedelta(microseconds=1)
        return self._now


def change_args(changes: Sequence[Change]) -> list[Any]:
    for c in changes:
        if f"message.{c.type}" not in EVENT_TYPES:
            raise ValueError(f"message.{c.type} is not an event type of the catalogue")
    return [
        [c.id for c in changes],
        [c.email_id for c in changes],
        [c.team_id for c in changes],
        [c.type for c in changes],
        [c.recipient for c in changes],
        [c.occurred_at for c in changes],
        [c.provider for c in changes],
        [c.code for c in changes],
        [c.message for c in changes],
        [json.dumps(_webhook_data(c)) for c in changes],
    ]


def _webhook_data(change: Change) -> dict[str, Any]:
    """The webhook event's ``data``: the email's, the change's provider, and
    the provider's status of an outcome (``code``, ``message``) however the
    change came about. Every key is there, null where it does not apply."""
    data = change.data | {"provider": change.provider}
    for key, value in (("code", change.code), ("message", change.message)):
        data[key] = value if value is not None else data.get(key)
    return data


async def record_changes(conn: Connection, changes: Sequence[Change]) -> None:
    """Write email events with their webhook events: one statement for any number."""
    if changes:
        await conn.fetchval(RECORD_CHANGES, *change_args(changes))
