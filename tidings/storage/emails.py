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
from typing import Any
from uuid import UUID, uuid4

from tidings.email.names import domain_name
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
CHANGE = """
change AS (
    SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::text[], $5::text[],
                         $6::timestamptz[], $7::text[], $8::text[], $9::text[], $10::jsonb[])
        AS c(id, email_id, team_id, type, recipient, occurred_at, provider, code, message, data)
)"""
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
# of the addresses ($3, lowercase) it suppresses.
ACCEPT_CHECK = """
SELECT ARRAY(SELECT name FROM domains
             WHERE team_id = $1 AND name = ANY($2::text[]) AND status = 'verified') AS verified,
       ARRAY(SELECT address FROM suppressions
             WHERE team_id = $1 AND address = ANY($3::text[])) AS suppressed
"""

# The emails ($11 the team, $12.. one array per column; the address lists as
# one JSON array of arrays) with their first events, in one statement; the
# team's senders are woken when (and only if) it commits.
ACCEPT = f"""
WITH {CHANGE}, inserted AS (
    INSERT INTO emails (id, team_id, from_address, from_email, to_addresses, cc, bcc, reply_to,
                        to_lookup, send_to, subject, html, text, headers, tags, status,
                        scheduled_at, template_id, template_version_id, domain,
                        smtp_message_id, provider, next_attempt_at, status_at)
    SELECT i.id, $11, i.from_address, i.from_email,
           ARRAY(SELECT jsonb_array_elements_text(i.lists -> 0)),
           ARRAY(SELECT jsonb_array_elements_text(i.lists -> 1)),
           ARRAY(SELECT jsonb_array_elements_text(i.lists -> 2)),
           ARRAY(SELECT jsonb_array_elements_text(i.lists -> 3)),
           ARRAY(SELECT jsonb_array_elements_text(i.lists -> 4)),
           ARRAY(SELECT jsonb_array_elements_text(i.lists -> 5)),
           i.subject, i.html, i.text, i.headers, i.tags, i.status, i.scheduled_at,
           i.template_id, i.template_version_id, i.domain, i.smtp_message_id, i.provider,
           CASE i.status WHEN 'queued' THEN now() WHEN 'scheduled' THEN i.scheduled_at END,
           i.status_at
    FROM unnest($12::uuid[], $13::text[], $14::text[], $15::jsonb[], $16::text[], $17::text[],
                $18::text[], $19::jsonb[], $20::jsonb[], $21::text[], $22::timestamptz[],
                $23::uuid[], $24::uuid[], $25::text[], $26::text[], $27::text[],
                $28::timestamptz[])
         AS i(id, from_address, from_email, lists, subject, html, text, headers, tags, status,
              scheduled_at, template_id, template_version_id, domain, smtp_message_id,
              provider, status_at)
    RETURNING status
), {RECORDED}
SELECT (SELECT woken FROM woken),
       (SELECT count(pg_notify('{DUE_CHANNEL}', $11::text))
        FROM (SELECT 1 FROM inserted WHERE status = 'queued' LIMIT 1) queued) AS senders
"""

SELECT_EMAIL = f"SELECT {EMAIL_COLUMNS} FROM emails WHERE team_id = $1 AND id = $2"

# $2 status, $3 a lowercase address in `to`, $4 and $5 the created_at range; NULL: no filter.
SELECT_EMAILS = f"""
SELECT {EMAIL_COLUMNS} FROM emails
WHERE team_id = $1
  AND ($2::text IS NULL OR status = $2)
  AND ($3::text IS NULL OR to_lookup @> ARRAY[$3::text])
  AND ($4::timestamptz IS NULL OR created_at >= $4)
  AND ($5::timestamptz IS NULL OR created_at <= $5)
ORDER BY created_at DESC, id DESC
LIMIT $6 OFFSET $7
"""

# No row: no such email. One row with a NULL id: an email without events (on this page).
SELECT_EVENTS = f"""
SELECT ev.* FROM emails e
LEFT JOIN LATERAL (
    SELECT {EVENT_COLUMNS} FROM email_events
    WHERE email_id = e.id
    ORDER BY occurred_at DESC, id DESC
    LIMIT $3 OFFSET $4
) ev ON true
WHERE e.team_id = $1 AND e.id = $2
"""

# Only a scheduled email that no process has taken up to send.
STILL_SCHEDULED = """
status = 'scheduled' AND (leased_until IS NULL OR leased_until < now())
"""

RESCHEDULE = f"""
UPDATE emails SET scheduled_at = $3, next_attempt_at = $3, updated_at = now()
WHERE team_id = $1 AND id = $2 AND {STILL_SCHEDULED}
RETURNING {EMAIL_COLUMNS}
"""

CANCEL = f"""
UPDATE emails SET status = 'canceled', status_at = $3, next_attempt_at = NULL,
                  updated_at = now()
WHERE team_id = $1 AND id = $2 AND {STILL_SCHEDULED}
RETURNING {EMAIL_COLUMNS}
"""

EXISTS = "SELECT status FROM emails WHERE team_id = $1 AND id = $2"


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
class Email:
    id: UUID
    team_id: UUID
    from_address: str
    from_email: str
    to_addresses: list[str]
    cc: list[str]
    bcc: list[str]
    reply_to: list[str]
    subject: str
    html: str | None
    text: str | None
    headers: dict[str, str]
    tags: list[dict[str, str]]
    status: str
    scheduled_at: datetime | None
    template_id: UUID | None
    template_version_id: UUID | None
    domain: str
    smtp_message_id: str
    provider: str | None
    attempt_count: int
    last_error: str | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: Any) -> Email:
        fields = dict(row)
        fields["headers"] = json.loads(fields["headers"])
        fields["tags"] = json.loads(fields["tags"])
        return cls(**fields)


@dataclass(frozen=True)
class EmailEvent:
    id: UUID
    email_id: UUID
    type: str
    recipient: str | None
    occurred_at: datetime
    provider: str | None
    code: str | None
    message: str | None


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


@dataclass(frozen=True)
class EmailFilter:
    status: str | None = None
    to: str | None = None
    start: datetime | None = None
    end: datetime | None = None


def event_data(
    email_id: UUID, from_address: str, to: Sequence[str], subject: str, **more: Any
) -> dict[str, Any]:
    """The ``data`` of a webhook event about an email (as Resend sends it)."""
    data = {"email_id": str(email_id), "from": from_address, "to": list(to), "subject": subject}
    data.update({key: value for key, value in more.items() if value is not None})
    return data


def recipients_text(addresses: Sequence[str]) -> str:
    """The ``to`` of an event about a whole email: its recipients, comma-separated."""
    return ", ".join(addresses)


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
        [json.dumps(c.data) for c in changes],
    ]


async def record_changes(conn: Any, changes: Sequence[Change]) -> None:
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


async def accept_emails(conn: Any, team_id: UUID, emails: Sequence[NewEmail]) -> None:
    """Store accepted emails with their first events: one statement for any number."""
    if not emails:
        return
    clock = Clock()
    changes = [change for email in emails for change in acceptance_changes(team_id, email, clock)]
    await conn.fetchrow(
        ACCEPT,
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
    )


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


async def accept(conn: Any, team_id: UUID, emails: Sequence[NewEmail]) -> list[NewEmail]:
    """Check and store emails as one unit, in two statements for any number:
    their domains must be verified sending domains of the team (else
    UnverifiedDomain, nothing stored); suppressed recipients are found; the
    emails are stored with their first events. Returns them as stored."""
    names = {e.domain: _domain_key(e.domain) for e in emails}
    lowered = sorted({a.lower() for e in emails for a in e.send_to})
    row = await conn.fetchrow(ACCEPT_CHECK, team_id, sorted(set(names.values())), lowered)
    verified, blocked = set(row["verified"]), set(row["suppressed"])
    checked = []
    for index, email in enumerate(emails):
        name = names[email.domain]
        if name not in verified:
            raise UnverifiedDomain(index, email.domain)
        found = [a for a in email.send_to if a.lower() in blocked]
        checked.append(replace(email, domain=name, suppressed=found))
    await accept_emails(conn, team_id, checked)
    return checked


async def get_email(conn: Any, team_id: UUID, email_id: UUID) -> Email | None:
    row = await conn.fetchrow(SELECT_EMAIL, team_id, email_id)
    return None if row is None else Email.from_row(row)


async def list_emails(
    conn: Any, team_id: UUID, where: EmailFilter, limit: int, offset: int
) -> list[Email]:
    """Newest first; ``where.to`` is a bare address, matched case-insensitively."""
    to = None if where.to is None else where.to.strip().lower()
    rows = await conn.fetch(
        SELECT_EMAILS, team_id, where.status, to, where.start, where.end, limit, offset
    )
    return [Email.from_row(row) for row in rows]


async def list_email_events(
    conn: Any, team_id: UUID, email_id: UUID, limit: int, offset: int
) -> list[EmailEvent] | None:
    """The email's events, newest first; None if the team has no such email."""
    rows = await conn.fetch(SELECT_EVENTS, team_id, email_id, limit, offset)
    if not rows:
        return None
    return [EmailEvent(**dict(row)) for row in rows if row["id"] is not None]


class NotScheduled(Exception):
    """The email exists but is no longer scheduled; ``status`` is what it is."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


async def _not_scheduled(conn: Any, team_id: UUID, email_id: UUID) -> None:
    status = await conn.fetchval(EXISTS, team_id, email_id)
    if status is not None:
        raise NotScheduled(status)


async def reschedule(
    conn: Any, team_id: UUID, email_id: UUID, scheduled_at: datetime
) -> Email | None:
    """Move a scheduled email's send; None if there is no such email.
    Raises NotScheduled when it is no longer scheduled (or is being sent)."""
    row = await conn.fetchrow(RESCHEDULE, team_id, email_id, scheduled_at)
    if row is None:
        await _not_scheduled(conn, team_id, email_id)
        return None
    return Email.from_row(row)


async def cancel(conn: Any, team_id: UUID, email_id: UUID) -> Email | None:
    """Cancel a scheduled email and record ``canceled``; None if there is no
    such email. Raises NotScheduled when it is no longer scheduled. Run it
    inside a transaction."""
    clock = Clock()
    at = clock.tick()
    row = await conn.fetchrow(CANCEL, team_id, email_id, at)
    if row is None:
        await _not_scheduled(conn, team_id, email_id)
        return None
    email = Email.from_row(row)
    data = event_data(email.id, email.from_address, email.to_addresses, email.subject)
    await record_changes(
        conn,
        [Change(email.id, team_id, "canceled", recipients_text(email.to_addresses), at,
                email.provider, data)],
    )
    return email
