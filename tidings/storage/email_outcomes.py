"""What happened to an email's recipients: outcomes recorded once each, whatever reports them.

The sandbox's outcomes (as followups), the relay's delivery reports and
abuse reports all go through :func:`record_outcomes`: each type of outcome
is recorded once per recipient, with its event and webhook event, the
email's status moves to the latest, and a bounce or a complaint suppresses
the address for the team. Every function here takes a raw connection and
runs inside ``Database.run``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from tidings.storage.connection import Connection
from tidings.storage.emails import Change, Clock, event_data, record_changes
from tidings.storage.suppressions import Reason, suppress_emails

# Outcomes that put the address on the team's suppression list.
SUPPRESSING: dict[str, Reason] = {"bounced": "bounce", "complained": "complaint"}

# Outcomes after which a recipient's delay is old news: a delay reported
# later (the relay's DSNs need not come in order) is recorded, but does not
# move the email's status back.
FINAL = ("delivered", "bounced", "complained", "failed")
FINAL_SQL = "(" + ", ".join(f"'{t}'" for t in FINAL) + ")"

EMAILS_OF = """
SELECT id, team_id, from_address, to_addresses, subject, broadcast_id FROM emails
WHERE id = ANY($1::uuid[]) ORDER BY id FOR NO KEY UPDATE
"""

# Which outcomes ($1-$3: email, recipient, type) are new: the first of each
# (email, recipient by lower(), type), unless the email has that event for
# that recipient already. Their ordinals (from 1), and whether the recipient
# has a final outcome already. Read after EMAILS_OF has locked the emails, so
# a writer that came first has committed its events. The events are read
# email by email (a lateral aggregate is never turned into a join), through
# the index on email_id, so the cost does not grow with the table: an anti
# join the planner may pick when its statistics lag (a table grown fast
# since its last ANALYZE) reads every event of every email.
NEW_OUTCOMES = f"""
SELECT DISTINCT ON (o.email_id, lower(o.recipient), o.type) o.i, seen.settled
FROM unnest($1::uuid[], $2::text[], $3::text[]) WITH ORDINALITY AS o(email_id, recipient, type, i)
CROSS JOIN LATERAL (
    SELECT coalesce(bool_or(ev.type = o.type), false) AS same,
           coalesce(bool_or(ev.type IN {FINAL_SQL}), false) AS settled
    FROM email_events ev
    WHERE ev.email_id = o.email_id AND lower(ev.recipient) = lower(o.recipient)
) seen
WHERE NOT seen.same
ORDER BY o.email_id, lower(o.recipient), o.type, o.i
"""

# Status moves to an outcome's type unless a later event is recorded already.
UPDATE_STATUS = """
UPDATE emails t SET status = r.status, status_at = r.at, updated_at = greatest(now(), r.at)
FROM unnest($1::uuid[], $2::text[], $3::timestamptz[]) AS r(id, status, at)
WHERE t.id = r.id AND t.status_at <= r.at
"""

# The email sent with a Message-ID ($2, whose local part is its id, $1),
# and the recipients it was handed over for (a `sent` event each): the only
# ones a later report can be about.
SENT_BY_SMTP_MESSAGE_ID = """
SELECT e.id, array_remove(array_agg(ev.recipient), NULL) AS recipients
FROM emails e LEFT JOIN email_events ev ON ev.email_id = e.id AND ev.type = 'sent'
WHERE e.id = $1 AND e.smtp_message_id = $2
GROUP BY e.id
"""
# The Message-ID Tidings gives an email: <email id@domain>.
_OWN_MESSAGE_ID = re.compile(
    r"<([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})@[^<>@]+>"
)


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


def suppressions_of(changes: Sequence[Change]) -> list[tuple[UUID, str, Reason, UUID | None]]:
    return [
        (c.team_id, c.recipient, SUPPRESSING[c.type], c.email_id)
        for c in changes
        if c.type in SUPPRESSING and c.recipient is not None
    ]


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
        row["i"] - 1: row["settled"]
        for row in await conn.fetch(
            NEW_OUTCOMES,
            [o.email_id for o in outcomes],
            [o.recipient for o in outcomes],
            [o.type for o in outcomes],
        )
    }
    recorded = [i in fresh and o.email_id in emails for i, o in enumerate(outcomes)]
    settled = {(o.email_id, o.recipient.lower()) for i, o in enumerate(outcomes)
               if fresh.get(i) or (recorded[i] and o.type in FINAL)}
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
        if change.type == "delivery_delayed" and (
            change.email_id, (change.recipient or "").lower()
        ) in settled:
            continue
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
    await suppress_emails(conn, suppressions_of(changes))
    return recorded


@dataclass(frozen=True)
class SentEmail:
    """An email as a later report sees it: the recipients it was sent to, by
    their address in lower case."""

    id: UUID
    sent_to: dict[str, str]


async def sent_email(conn: Connection, message_id: str) -> SentEmail | None:
    """The email sent with this ``Message-ID`` (``<email id@domain>``), if any."""
    message_id = message_id.strip()
    own = _OWN_MESSAGE_ID.fullmatch(message_id)
    if own is None:
        return None
    row = await conn.fetchrow(SENT_BY_SMTP_MESSAGE_ID, UUID(own.group(1)), message_id)
    if row is None:
        return None
    return SentEmail(row["id"], {address.lower(): address for address in row["recipients"]})
