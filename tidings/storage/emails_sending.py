"""Sending emails in PostgreSQL: claim due emails, record attempts and outcomes.

An email is due while ``next_attempt_at`` is set and has come: queued
emails at once, scheduled ones at ``scheduled_at``, retries after their
backoff. Due emails are leased rows (``tidings.storage.leases``) owned by
their team: the team's actor claims them, and an attempt is recorded only
while the lease is still this process's, with its events, in one
transaction for a whole batch of attempts.

What a provider reports for later (the sandbox's outcomes, announced at
send time) is written to ``email_followups`` in the attempt's transaction
and recorded when due; outcomes that arrive by other paths (delivery
reports, abuse reports) go through :func:`record_outcomes` too, which
records each type of outcome once per recipient. A bounce or a complaint
suppresses the address for the team.

Every function here takes a raw connection and runs inside ``Database.run``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from tidings.storage.connection import Connection
from tidings.storage.emails import DUE_CHANNEL, Change, Clock, event_data, record_changes
from tidings.storage.leases import keys_of, lease_sql, owners_of
from tidings.storage.suppressions import Reason, suppress_emails
from tidings.storage.topics import not_opted_in

__all__ = ["DUE_CHANNEL"]

# Outcomes that put the address on the team's suppression list.
SUPPRESSING: dict[str, Reason] = {"bounced": "bounce", "complained": "complaint"}

LEASES = lease_sql(
    "emails",
    owner="team_id",
    due="t.next_attempt_at",
    pending="t.next_attempt_at IS NOT NULL",
    claimed=f"""
SELECT c.id, c.team_id, c.from_address, c.from_email, c.to_addresses, c.cc, c.reply_to,
       c.send_to, c.subject, c.html, c.text, c.headers::text AS headers, c.domain,
       c.smtp_message_id, c.attempt_count, c.status, c.broadcast_id,
       ARRAY(SELECT a FROM unnest(c.send_to) a
             WHERE EXISTS (SELECT 1 FROM suppressions s
                           WHERE s.team_id = c.team_id AND s.address = lower(a)))
           AS suppressed,
       c.contact_id IS NOT NULL AND EXISTS (
           SELECT 1 FROM contacts k JOIN broadcasts b ON b.id = c.broadcast_id
           WHERE k.id = c.contact_id AND (k.unsubscribed OR (
               b.topic_id IS NOT NULL AND {not_opted_in("b.topic_id", "k.id")})))
           AS unsubscribed
FROM claimed c
""",
)

# $1 the lease owner; per email: its id, new status (NULL: unchanged) and
# when, the next attempt (NULL: done), the error, the provider, the
# recipients left to try (JSON array).
RECORD_ATTEMPTS = """
UPDATE emails t SET
    status = coalesce(r.status, t.status),
    status_at = CASE WHEN r.status IS NULL THEN t.status_at ELSE r.status_at END,
    next_attempt_at = r.next_at,
    attempt_count = t.attempt_count + 1,
    last_error = r.error,
    provider = r.provider,
    send_to = ARRAY(SELECT jsonb_array_elements_text(r.send_to)),
    lease_owner = NULL,
    leased_until = NULL,
    updated_at = greatest(now(), r.status_at)
FROM unnest($2::uuid[], $3::text[], $4::timestamptz[], $5::timestamptz[], $6::text[],
            $7::text[], $8::jsonb[])
     AS r(id, status, status_at, next_at, error, provider, send_to)
WHERE t.id = r.id AND t.lease_owner = $1
RETURNING t.id
"""

INSERT_FOLLOWUPS = """
INSERT INTO email_followups (email_id, recipient, type, due_at, provider, code, message)
SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::timestamptz[], $5::text[],
                     $6::text[], $7::text[])
"""

# Due followups of every team, taken out in the caller's transaction: the
# transaction that records them, so a crash loses none and none twice.
TAKE_FOLLOWUPS = """
WITH due AS (
    SELECT id FROM email_followups WHERE due_at <= now()
    ORDER BY due_at LIMIT $1 FOR UPDATE SKIP LOCKED
)
DELETE FROM email_followups f USING due WHERE f.id = due.id
RETURNING f.email_id, f.recipient, f.type, f.provider, f.code, f.message
"""

FOLLOWUP_DUE_IN = "SELECT extract(epoch FROM min(due_at) - now())::float8 FROM email_followups"

# The emails outcomes are about, locked (in one order, so that two writers
# cannot deadlock) until the transaction ends: outcomes of one email are
# recorded one writer after the other, and each sees what the last recorded.
EMAILS_OF = """
SELECT id, team_id, from_address, to_addresses, subject, broadcast_id FROM emails
WHERE id = ANY($1::uuid[]) ORDER BY id FOR NO KEY UPDATE
"""

# Which outcomes ($1-$3: email, recipient, type) are new: the first of each
# (email, recipient by lower(), type), unless the email has that event for
# that recipient already. Their ordinals (from 1). Read after EMAILS_OF has
# locked the emails, so a writer that came first has committed its events.
NEW_OUTCOMES = """
SELECT DISTINCT ON (o.email_id, lower(o.recipient), o.type) o.i
FROM unnest($1::uuid[], $2::text[], $3::text[]) WITH ORDINALITY AS o(email_id, recipient, type, i)
WHERE NOT EXISTS (SELECT 1 FROM email_events ev
                  WHERE ev.email_id = o.email_id AND ev.type = o.type
                    AND lower(ev.recipient) = lower(o.recipient))
ORDER BY o.email_id, lower(o.recipient), o.type, o.i
"""

# Status moves to an outcome's type unless a later event is recorded already.
UPDATE_STATUS = """
UPDATE emails t SET status = r.status, status_at = r.at, updated_at = greatest(now(), r.at)
FROM unnest($1::uuid[], $2::text[], $3::timestamptz[]) AS r(id, status, at)
WHERE t.id = r.id AND t.status_at <= r.at
"""

# The email sent with a Message-ID, and the recipients it was handed over
# for (a `sent` event each): the only ones a later report can be about.
SENT_BY_SMTP_MESSAGE_ID = """
SELECT e.id, array_remove(array_agg(ev.recipient), NULL) AS recipients
FROM emails e LEFT JOIN email_events ev ON ev.email_id = e.id AND ev.type = 'sent'
WHERE e.smtp_message_id = $1
GROUP BY e.id
"""


@dataclass(frozen=True)
class Claimed:
    """A due email, leased for one attempt."""

    id: UUID
    team_id: UUID
    from_address: str
    from_email: str
    to_addresses: list[str]
    cc: list[str]
    reply_to: list[str]
    send_to: list[str]
    subject: str
    html: str | None
    text: str | None
    headers: dict[str, str]
    domain: str
    smtp_message_id: str
    attempt_count: int
    status: str
    broadcast_id: UUID | None  # in every event's data of a broadcast's email
    # Those of send_to the team has suppressed since (as spelled in send_to).
    suppressed: list[str]
    # A broadcast's email whose contact unsubscribed (or left its topic) since.
    unsubscribed: bool = False

    @classmethod
    def from_row(cls, row: Any) -> Claimed:
        fields = dict(row)
        fields["headers"] = json.loads(fields["headers"])
        return cls(**fields)

    def data(self, **more: Any) -> dict[str, Any]:
        return event_data(self.id, self.from_address, self.to_addresses, self.subject,
                          broadcast_id=self.broadcast_id and str(self.broadcast_id), **more)


@dataclass(frozen=True)
class Followup:
    """An outcome to record ``due_at``."""

    email_id: UUID
    recipient: str
    type: str
    due_at: datetime
    provider: str
    code: str | None = None
    message: str | None = None


@dataclass(frozen=True)
class Attempted:
    """An attempt's result, to record while the lease holds.

    ``status`` None leaves the status as it is (a retry with no event);
    ``next_at`` None means nothing is left to send; ``send_to`` are the
    recipients still to try.
    """

    email: Claimed
    status: str | None
    status_at: datetime | None
    next_at: datetime | None
    error: str | None
    provider: str
    send_to: list[str]
    changes: list[Change] = field(default_factory=list)
    followups: list[Followup] = field(default_factory=list)


@dataclass(frozen=True)
class Outcome:
    """What happened to one recipient of an email (a report, a followup)."""

    email_id: UUID
    recipient: str
    type: str
    provider: str | None
    code: str | None = None
    message: str | None = None
    occurred_at: datetime | None = None


async def due_teams(conn: Connection, limit: int) -> list[UUID]:
    return owners_of(await conn.fetch(LEASES.due_owners, limit))


async def claim(
    conn: Connection, team_id: UUID, owner: UUID, lease_seconds: float, limit: int
) -> tuple[list[Claimed], float | None]:
    """Lease up to ``limit`` due emails of the team; and, when fewer were due,
    the seconds until the team's next email falls due (None: none scheduled)."""
    rows = await conn.fetch(LEASES.claim, team_id, owner, lease_seconds, limit)
    claimed = [Claimed.from_row(row) for row in rows]
    next_in = None
    if len(claimed) < limit:
        next_in = await conn.fetchval(LEASES.seconds_to_next_due, team_id)
    return claimed, next_in


async def renew(
    conn: Connection, ids: Sequence[UUID], owner: UUID, lease_seconds: float
) -> set[UUID]:
    """Extend the leases of emails still being sent; those still held."""
    return set(keys_of(await conn.fetch(LEASES.renew, list(ids), owner, lease_seconds)))


async def release(conn: Connection, ids: Sequence[UUID], owner: UUID) -> None:
    await conn.execute(LEASES.release, list(ids), owner)


def _suppressions(changes: Sequence[Change]) -> list[tuple[UUID, str, Reason, UUID | None]]:
    return [
        (c.team_id, c.recipient, SUPPRESSING[c.type], c.email_id)
        for c in changes
        if c.type in SUPPRESSING and c.recipient is not None
    ]


async def record_attempts(conn: Connection, owner: UUID, done: Sequence[Attempted]) -> int:
    """Record attempts whose lease this process still holds, with their events,
    followups and suppressions, in one transaction; returns how many."""
    async with conn.transaction():
        rows = await conn.fetch(
            RECORD_ATTEMPTS,
            owner,
            [a.email.id for a in done],
            [a.status for a in done],
            [a.status_at for a in done],
            [a.next_at for a in done],
            [a.error for a in done],
            [a.provider for a in done],
            [json.dumps(a.send_to) for a in done],
        )
        held = {row["id"] for row in rows}
        kept = [a for a in done if a.email.id in held]
        changes = [c for a in kept for c in a.changes]
        await record_changes(conn, changes)
        followups = [f for a in kept for f in a.followups]
        if followups:
            await conn.execute(
                INSERT_FOLLOWUPS,
                [f.email_id for f in followups],
                [f.recipient for f in followups],
                [f.type for f in followups],
                [f.due_at for f in followups],
                [f.provider for f in followups],
                [f.code for f in followups],
                [f.message for f in followups],
            )
        await suppress_emails(conn, _suppressions(changes))
    return len(kept)


async def record_outcomes(conn: Connection, outcomes: Sequence[Outcome]) -> list[bool]:
    """Record what happened to recipients of emails, whatever reported it:
    events, status, and a suppression for a bounce or a complaint; whether
    each outcome was recorded, in order. An outcome is recorded once per
    email, recipient (any case) and type: one the email has an event of for
    that recipient already (a report repeated, the sandbox's outcome then the
    relay's report of it), or one given twice, is skipped, as are outcomes of
    emails that do not exist. A complaint after a bounce is a new outcome.
    Run it inside a transaction: the emails stay locked until it ends."""
    if not outcomes:
        return []
    rows = await conn.fetch(EMAILS_OF, list({o.email_id for o in outcomes}))
    emails = {row["id"]: row for row in rows}
    fresh = {
        row["i"] - 1
        for row in await conn.fetch(
            NEW_OUTCOMES,
            [o.email_id for o in outcomes],
            [o.recipient for o in outcomes],
            [o.type for o in outcomes],
        )
    }
    recorded = [i in fresh and o.email_id in emails for i, o in enumerate(outcomes)]
    clock = Clock()
    changes = []
    for o, new in zip(outcomes, recorded, strict=True):
        if not new:
            continue
        email = emails[o.email_id]
        broadcast_id = email["broadcast_id"] and str(email["broadcast_id"])
        data = event_data(email["id"], email["from_address"], email["to_addresses"],
                          email["subject"], code=o.code, message=o.message,
                          broadcast_id=broadcast_id)
        changes.append(Change(
            o.email_id, email["team_id"], o.type, o.recipient, o.occurred_at or clock.tick(),
            o.provider, data, code=o.code, message=o.message,
        ))
    last: dict[UUID, Change] = {}
    for change in changes:
        if change.email_id not in last or last[change.email_id].occurred_at <= change.occurred_at:
            last[change.email_id] = change
    if last:
        await conn.execute(
            UPDATE_STATUS,
            list(last),
            [c.type for c in last.values()],
            [c.occurred_at for c in last.values()],
        )
    await record_changes(conn, changes)
    await suppress_emails(conn, _suppressions(changes))
    return recorded


async def record_outcome(
    conn: Connection,
    email_id: UUID,
    recipient: str,
    type: str,
    *,
    provider: str | None,
    code: str | None = None,
    message: str | None = None,
) -> bool:
    """Record one recipient's outcome (a delivery or abuse report's); False if
    there is no such email or the outcome is recorded for that recipient
    already. Run it inside a transaction."""
    outcome = Outcome(email_id, recipient, type, provider, code, message)
    return (await record_outcomes(conn, [outcome]))[0]


@dataclass(frozen=True)
class SentEmail:
    """An email as a later report sees it: the recipients it was sent to, by
    their address in lower case."""

    id: UUID
    sent_to: dict[str, str]


async def sent_email(conn: Connection, message_id: str) -> SentEmail | None:
    """The email sent with this ``Message-ID`` (``<...@domain>``), if any."""
    row = await conn.fetchrow(SENT_BY_SMTP_MESSAGE_ID, message_id.strip())
    if row is None:
        return None
    return SentEmail(row["id"], {address.lower(): address for address in row["recipients"]})


async def record_due_followups(conn: Connection, limit: int) -> tuple[int, float | None]:
    """Record up to ``limit`` due followups in one transaction; how many, and
    the seconds until the next one falls due (None: none left)."""
    async with conn.transaction():
        rows = await conn.fetch(TAKE_FOLLOWUPS, limit)
        outcomes = [
            Outcome(row["email_id"], row["recipient"], row["type"], row["provider"],
                    row["code"], row["message"])
            for row in rows
        ]
        await record_outcomes(conn, outcomes)
    next_in = await conn.fetchval(FOLLOWUP_DUE_IN)
    return len(rows), next_in


async def followups_due(conn: Connection, limit: int) -> list[str]:
    """The dispatcher's poll: one key while any followup is due."""
    due = await conn.fetchval(FOLLOWUP_DUE_IN)
    return ["followups"] if due is not None and due <= 0 else []
