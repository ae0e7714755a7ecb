"""Emails as the API shows and changes them after acceptance: get, list, page
their events, reschedule and cancel. Accepting and sending are in
``tidings.storage.emails`` and ``tidings.storage.emails_sending``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from tidings.addresses import lookup_address
from tidings.storage.connection import Connection
from tidings.storage.emails import (
    EMAIL_COLUMNS,
    EVENT_COLUMNS,
    Change,
    Clock,
    event_data,
    recipients_text,
    record_changes,
)

SELECT_EMAIL = f"SELECT {EMAIL_COLUMNS} FROM emails WHERE team_id = $1 AND id = $2"

# $2 status, $3 a lowercase address in `to`, $4 and $5 the created_at range; NULL: no filter.
SELECT_EMAILS = f"""
SELECT {EMAIL_COLUMNS} FROM emails
WHERE team_id = $1
  AND ($2::text IS NULL OR status = $2)
  AND ($3::text IS NULL OR to_lookup @> ARRAY[lower($3::text)])
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

# Only a scheduled email that no process has taken up to send, and whose
# earlier attempt (if any) was not given back unrecorded. A lease that ran
# out without its attempt recorded (the process died) keeps ``lease_owner``;
# an attempt cut short (tidings.storage.emails_sending.give_back) marks
# ``attempt_begun``: either may have reached some recipients, so the email
# is no longer scheduled, whatever its status says until the next attempt
# records it.
STILL_SCHEDULED = """
status = 'scheduled' AND lease_owner IS NULL AND NOT attempt_begun
"""

RESCHEDULE = f"""
UPDATE emails SET scheduled_at = $3, next_attempt_at = $3, updated_at = now()
WHERE team_id = $1 AND id = $2 AND {STILL_SCHEDULED}
RETURNING {EMAIL_COLUMNS}
"""

CANCEL = f"""
UPDATE emails SET status = 'canceled', status_at = $3, next_attempt_at = NULL,
                  updated_at = greatest(now(), $3)
WHERE team_id = $1 AND id = $2 AND {STILL_SCHEDULED}
RETURNING {EMAIL_COLUMNS}
"""

EXISTS = """
SELECT CASE WHEN status = 'scheduled' THEN 'being sent' ELSE status END
FROM emails WHERE team_id = $1 AND id = $2
"""


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
class EmailFilter:
    status: str | None = None
    to: str | None = None
    start: datetime | None = None
    end: datetime | None = None


async def get_email(conn: Connection, team_id: UUID, email_id: UUID) -> Email | None:
    row = await conn.fetchrow(SELECT_EMAIL, team_id, email_id)
    return None if row is None else Email.from_row(row)


async def list_emails(
    conn: Connection, team_id: UUID, where: EmailFilter, limit: int, offset: int
) -> list[Email]:
    """Newest first; ``where.to`` is a bare address, matched as stored
    (``to_lookup``) by ``lookup_address``."""
    to = None if where.to is None else lookup_address(where.to)
    rows = await conn.fetch(
        SELECT_EMAILS, team_id, where.status, to, where.start, where.end, limit, offset
    )
    return [Email.from_row(row) for row in rows]


async def list_email_events(
    conn: Connection, team_id: UUID, email_id: UUID, limit: int, offset: int
) -> list[EmailEvent] | None:
    """The email's events, newest first; None if the team has no such email."""
    rows = await conn.fetch(SELECT_EVENTS, team_id, email_id, limit, offset)
    if not rows:
        return None
    return [EmailEvent(**dict(row)) for row in rows if row["id"] is not None]


class NotScheduled(Exception):
    """The email exists but is no longer scheduled; ``status`` is what it is,
    or ``being sent`` for a scheduled email a process has taken up."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


async def _not_scheduled(conn: Connection, team_id: UUID, email_id: UUID) -> None:
    status = await conn.fetchval(EXISTS, team_id, email_id)
    if status is not None:
        raise NotScheduled(status)


async def reschedule(
    conn: Connection, team_id: UUID, email_id: UUID, scheduled_at: datetime
) -> Email | None:
    """Move a scheduled email's send; None if there is no such email.
    Raises NotScheduled when it is no longer scheduled (or is being sent)."""
    row = await conn.fetchrow(RESCHEDULE, team_id, email_id, scheduled_at)
    if row is None:
        await _not_scheduled(conn, team_id, email_id)
        return None
    return Email.from_row(row)


async def cancel(conn: Connection, team_id: UUID, email_id: UUID) -> Email | None:
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
