"""Emails of a team: acceptance, reading, rescheduling and canceling.

An email's ``status`` is the type of its last event. Every state change
writes, in one transaction: the email's row, its ``email_events`` row and
the webhook event ``message.<type>`` (``tidings.storage.events``), which
share one id. The send itself, and the outcomes reported after it, are in
``tidings.storage.emails_sending``.

Functions that write several statements expect to run inside the caller's
transaction.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from email.utils import getaddresses
from typing import Any
from uuid import UUID, uuid4

from tidings.config import QuotaDefaults
from tidings.email.names import domain_name
from tidings.storage import quotas
from tidings.storage.connection import Connection, returned
from tidings.storage.events import FANOUT
from tidings.storage.quota_stripes import fast_claim_sql
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

# What acceptance checks, in one round trip: which of the names ($2) are
# verified sending domains of the team (the domains group's table), and which
# of the addresses ($3, as given) it suppresses (folded by lower(), as stored).
ACCEPT_CHECK = """
SELECT ARRAY(SELECT name FROM domains
             WHERE team_id = $1 AND name = ANY($2::text[]) AND status = 'verified') AS verified,
       ARRAY(SELECT a FROM unnest($3::text[]) a
             WHERE EXISTS (SELECT 1 FROM suppressions s
                           WHERE s.team_id = $1 AND s.address = lower(a))) AS suppressed
"""

# The emails ($11 the team, $12.. one array per column; the address lists as
# one JSON array of arrays) with their first events, in one statement; the
# team's senders are woken when (and only if) it commits.
INSERTED = """
inserted AS (
    INSERT INTO emails (id, team_id, from_address, from_email, to_addresses, cc, bcc, reply_to,
                        to_lookup, send_to, subject, html, text, headers, tags, status,
                        scheduled_at, template_id, template_version_id, domain,
                        smtp_message_id, provider, next_attempt_at, status_at, created_at)
    SELECT i.id, $11, i.from_address, i.from_email,
           ARRAY(SELECT jsonb_array_elements_text(i.lists -> 0)),
           ARRAY(SELECT jsonb_array_elements_text(i.lists -> 1)),
           ARRAY(SELECT jsonb_array_elements_text(i.lists -> 2)),
           ARRAY(SELECT jsonb_array_elements_text(i.lists -> 3)),
           ARRAY(SELECT lower(a) FROM jsonb_array_elements_text(i.lists -> 4) a),
           ARRAY(SELECT jsonb_array_elements_text(i.lists -> 5)),
           i.subject, i.html, i.text, i.headers, i.tags, i.status, i.scheduled_at,
           i.template_id, i.template_version_id, i.domain, i.smtp_message_id, i.provider,
           CASE i.status WHEN 'queued' THEN now() WHEN 'scheduled' THEN i.scheduled_at END,
           i.status_at,
           -- Its first event's time (the service's clock, as every event's
           -- is), so that no event of an email is older than the email.
           coalesce((SELECT min(c.occurred_at) FROM change c WHERE c.email_id = i.id), now())
    FROM unnest($12::uuid[], $13::text[], $14::text[], $15::jsonb[], $16::text[], $17::text[],
                $18::text[], $19::jsonb[], $20::jsonb[], $21::text[], $22::timestamptz[],
                $23::uuid[], $24::uuid[], $25::text[], $26::text[], $27::text[],
                $28::timestamptz[])
         AS i(id, from_address, from_email, lists, subject, html, text, headers, tags, status,
              scheduled_at, template_id, template_version_id, domain, smtp_message_id,
              provider, status_at)
    {gate}
    RETURNING status
)"""
ACCEPT = f"""
WITH {CHANGE}, {INSERTED.format(gate="")}, {RECORDED}
SELECT (SELECT woken FROM woken),
       (SELECT count(pg_notify('{DUE_CHANNEL}', $11::text))
        FROM (SELECT 1 FROM inserted WHERE status = 'queued' LIMIT 1) queued) AS senders
"""

# ACCEPT and the quota's fast path in one statement ($29 the recipients to
# count, $30/$31 the UTC day and month, $32/$33 the default limits): the
# emails and their events are written only if a stripe counted them (or
# there is nothing to count); otherwise nothing is, and the caller takes the
# slow path.
_QUOTA, _ = fast_claim_sql(
    ready=" AND $29::bigint > 0",
    team="$11::uuid", channel="'email'", n="$29::bigint", day="$30::date", month="$31::date",
    per_day="$32::bigint", per_month="$33::bigint",
)
_COUNTED = "($29::bigint = 0 OR EXISTS (SELECT 1 FROM quota_counted))"
ACCEPT_CLAIMING = f"""
WITH {_QUOTA}, change AS ({CHANGE_ROWS} WHERE {_COUNTED}),
{INSERTED.format(gate="WHERE " + _COUNTED)}, {RECORDED}
SELECT (SELECT woken FROM woken),
       (SELECT count(pg_notify('{DUE_CHANNEL}', $11::text))
        FROM (SELECT 1 FROM inserted WHERE status = 'queued' LIMIT 1) queued) AS senders,
       {_COUNTED} AS stored
"""


@dataclass(frozen=True)
class NewEmail:
    """An email checked and ready to store. Addresses are as shown (with a
    display name where given); ``send_to`` holds the bare envelope
    recipients and ``suppressed`` those of them the team must not send to."""

    from_address: str
    from_email: str
    to: list[str]
    to_lookup: list[str]
    cc: list[str]
    bcc: list[str]
    reply_to: list[str]
    send_to: list[str]
    subject: str
    html: str | None
    text: str | None
    headers: dict[str, str]
    tags: list[dict[str, str]]
    scheduled_at: datetime | None
    domain: str
    provider: str
    template_id: UUID | None = None
    template_version_id: UUID | None = None
    suppressed: list[str] = field(default_factory=list)
    id: UUID = field(default_factory=uuid4)

    @property
    def status(self) -> str:
        if not self.remaining:
            return "suppressed"
        return "scheduled" if self.scheduled_at is not None else "queued"

    @property
    def remaining(self) -> list[str]:
        """The envelope recipients to send to: those not suppressed."""
        return [a for a in self.send_to if a not in set(self.suppressed)]

    @property
    def smtp_message_id(self) -> str:
        return f"<{self.id}@{self.domain}>"


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
    id: UUID = field(default_factory=uuid4)


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
    return ", ".join(address for _, address in getaddresses(list(addresses)) if address)


class Clock:
    """Event times that keep their order within one write: each tick is one
    microsecond after the last, so events written together list in order."""

    def __init__(self) -> None:
        self._now = datetime.now(UTC)

    def tick(self) -> datetime:
        self._now += timedelta(microseconds=1)
        return self._now


def _change_args(changes: Sequence[Change]) -> list[Any]:
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
        await conn.fetchval(RECORD_CHANGES, *_change_args(changes))


def acceptance_changes(team_id: UUID, email: NewEmail, clock: Clock) -> list[Change]:
    """The events of an accepted email: one ``suppressed`` per suppressed
    recipient, then ``scheduled`` or ``queued`` unless nothing is left to send."""
    data = event_data(email.id, email.from_address, email.to, email.subject)
    changes = [
        Change(email.id, team_id, "suppressed", address, clock.tick(), email.provider, data,
               message="the address is on the team's suppression list")
        for address in email.suppressed
    ]
    if email.status != "suppressed":
        changes.append(
            Change(email.id, team_id, email.status, recipients_text(email.to), clock.tick(),
                   email.provider, data)
        )
    return changes


def _accept_args(team_id: UUID, emails: Sequence[NewEmail]) -> list[Any]:
    """$1..$28 of ACCEPT: the events, the team, then one array per column."""
    clock = Clock()
    changes = [change for email in emails for change in acceptance_changes(team_id, email, clock)]
    return [
        *_change_args(changes),
        team_id,
        [e.id for e in emails],
        [e.from_address for e in emails],
        [e.from_email for e in emails],
        [json.dumps([e.to, e.cc, e.bcc, e.reply_to, e.to_lookup, e.remaining]) for e in emails],
        [e.subject for e in emails],
        [e.html for e in emails],
        [e.text for e in emails],
        [json.dumps(e.headers) for e in emails],
        [json.dumps(e.tags) for e in emails],
        [e.status for e in emails],
        [e.scheduled_at for e in emails],
        [e.template_id for e in emails],
        [e.template_version_id for e in emails],
        [e.domain for e in emails],
        [e.smtp_message_id for e in emails],
        [e.provider for e in emails],
        [clock.tick() for _ in emails],
    ]


async def accept_emails(conn: Connection, team_id: UUID, emails: Sequence[NewEmail]) -> None:
    """Store accepted emails with their first events: one statement for any number."""
    if emails:
        await conn.fetchrow(ACCEPT, *_accept_args(team_id, emails))


class UnverifiedDomain(Exception):
    """The ``from`` of the email at ``index`` is not on a verified domain of the team."""

    def __init__(self, index: int, domain: str) -> None:
        super().__init__(domain)
        self.index = index
        self.domain = domain


def _domain_key(name: str) -> str:
    try:
        return domain_name(name)
    except ValueError:
        return name


async def accept(
    conn: Connection, team_id: UUID, emails: Sequence[NewEmail], limits: QuotaDefaults
) -> list[NewEmail]:
    """Check and store emails as one unit, in two statements for any number:
    their domains must be verified sending domains of the team (else
    UnverifiedDomain, nothing stored) and suppressed recipients are found;
    then the emails are stored with their first events and every recipient
    who is not suppressed counts against the team's email quotas, in one
    statement when the quota's fast path takes them, else in a transaction
    that takes the slow path (QuotaExceeded: nothing stored). Returns them
    as stored."""
    names = {e.domain: _domain_key(e.domain) for e in emails}
    addresses = sorted({a for e in emails for a in e.send_to})
    row = returned(await conn.fetchrow(
        ACCEPT_CHECK, team_id, sorted(set(names.values())), addresses
    ))
    verified, blocked = set(row["verified"]), set(row["suppressed"])
    checked = []
    for index, email in enumerate(emails):
        name = names[email.domain]
        if name not in verified:
            raise UnverifiedDomain(index, email.domain)
        found = [a for a in email.send_to if a in blocked]
        checked.append(replace(email, domain=name, suppressed=found))
    sending = sum(len(e.send_to) - len(e.suppressed) for e in checked)
    args = _accept_args(team_id, checked)
    quota = quotas.claim_args(team_id, "email", sending, limits, datetime.now(UTC))
    stored = await quotas.fast_attempt(
        conn, ACCEPT_CLAIMING, [*args, *quota[2:]], lambda row: row is not None and row["stored"]
    )
    if returned(stored)["stored"]:
        return checked
    # No stripe of the quota had room (or all were held): the slow path.
    async with conn.transaction():
        await conn.fetchrow(ACCEPT, *args)
        await quotas.claim(conn, team_id, "email", sending, limits)
    return checked
