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

from tidings.ids import new_id
from tidings.storage.connection import Connection
from tidings.storage.email_outcomes import Outcome, record_outcomes, suppressions_of
from tidings.storage.emails import DUE_CHANNEL, Change, event_data, record_changes
from tidings.storage.leases import claim_rows, keys_of, lease_sql, owners_of
from tidings.storage.suppressions import suppress_emails
from tidings.storage.topics import not_opted_in

__all__ = ["DUE_CHANNEL"]

LEASES = lease_sql(
    "emails",
    owner="team_id",
    due="t.next_attempt_at",
    pending="t.next_attempt_at IS NOT NULL",
    owners_index="next_attempt_at IS NOT NULL",  # emails_due
    # A team's own emails go before its broadcasts' (emails_due_own): a
    # password reset never waits behind 100,000 newsletters.
    ahead="t.broadcast_id IS NULL",
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
    attempt_count = t.attempt_count + CASE WHEN r.counted THEN 1 ELSE 0 END,
    last_error = r.error,
    provider = r.provider,
    send_to = ARRAY(SELECT jsonb_array_elements_text(r.send_to)),
    lease_owner = NULL,
    leased_until = NULL,
    updated_at = greatest(now(), r.status_at)
FROM unnest($2::uuid[], $3::text[], $4::timestamptz[], $5::timestamptz[], $6::text[],
            $7::text[], $8::jsonb[], $9::boolean[])
     AS r(id, status, status_at, next_at, error, provider, send_to, counted)
WHERE t.id = r.id AND t.lease_owner = $1
RETURNING t.id
"""

# Emails whose attempt began and was not recorded (cut short, or its
# recording failed), handed back to be tried again at once: marked as begun,
# which tells cancel and PATCH that an attempt may have reached some
# recipients (tidings.storage.emails_manage), whoever takes it up next.
GIVE_BACK = """
UPDATE emails SET leased_until = now(), attempt_begun = true
WHERE id = ANY($1) AND lease_owner = $2
"""

INSERT_FOLLOWUPS = """
INSERT INTO email_followups (email_id, recipient, type, due_at, provider, code, message, id)
SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::timestamptz[], $5::text[],
                     $6::text[], $7::text[], $8::uuid[])
"""

# Due followups of every team, taken out in the caller's transaction: the
# transaction that records them, so a crash loses none and none twice.
TAKE_FOLLOWUPS = """
WITH due AS (
    SELECT id FROM email_followups WHERE due_at <= now()
    ORDER BY due_at LIMIT $1 FOR UPDATE SKIP LOCKED
), taken AS (
    DELETE FROM email_followups f USING due WHERE f.id = due.id
    RETURNING f.email_id, f.recipient, f.type, f.provider, f.code, f.message, f.due_at
)
-- In the order they fell due (a DELETE returns its rows in no order).
SELECT * FROM taken ORDER BY due_at
"""

FOLLOWUP_DUE_IN = "SELECT extract(epoch FROM min(due_at) - now())::float8 FROM email_followups"

# The emails outcomes are about, locked (in one order, so that two writers
# cannot deadlock) until the transaction ends: outcomes of one email are
# recorded one writer after the other, and each sees what the last recorded.
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
    # False: an attempt cut short, which uses no step of the retry schedule.
    counted: bool = True


async def due_teams(conn: Connection, limit: int) -> list[UUID]:
    return owners_of(await conn.fetch(LEASES.due_owners, limit))


async def claim(
    conn: Connection, team_id: UUID, owner: UUID, lease_seconds: float, limit: int
) -> tuple[list[Claimed], float | None]:
    """Lease up to ``limit`` due emails of the team; and, when fewer were due,
    the seconds until the team's next email falls due (None: none scheduled)."""
    rows = await claim_rows(conn, LEASES.claim, team_id, owner, lease_seconds, limit)
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
    """Hand back emails whose attempt never began: as if never claimed."""
    await conn.execute(LEASES.release, list(ids), owner)


async def give_back(conn: Connection, ids: Sequence[UUID], owner: UUID) -> None:
    """Hand back emails whose attempt began but was not recorded (``GIVE_BACK``)."""
    await conn.execute(GIVE_BACK, list(ids), owner)


async def record_attempts(
    conn: Connection, owner: UUID, done: Sequence[Attempted], skipped: Sequence[UUID] = ()
) -> int:
    """Record attempts whose lease this process still holds, with their events,
    followups and suppressions, in one transaction; returns how many. The
    emails ``skipped`` (their attempt never began) are released in it."""
    async with conn.transaction():
        if skipped:
            await conn.execute(LEASES.release, list(skipped), owner)
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
            [a.counted for a in done],
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
                [new_id() for _ in followups],
            )
        await suppress_emails(conn, suppressions_of(changes))
    return len(kept)


async def record_due_followups(conn: Connection, limit: int) -> tuple[int, float | None]:
    """Record up to ``limit`` due followups in one transaction; how many, and
    the seconds until the next one falls due (None: none left)."""
    async with conn.transaction():
        rows = await claim_rows(conn, TAKE_FOLLOWUPS, limit)
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
