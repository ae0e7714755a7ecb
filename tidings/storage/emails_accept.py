"""Acceptance of emails: the checks and the writes of ``POST /emails`` and
``POST /emails/batch``, in one statement for the common send.

An accepted email is stored with its first events (``scheduled`` or
``queued``, and ``suppressed`` for each suppressed recipient) and counted
against the team's email quota; see ``tidings.storage.emails`` for the
events every later change writes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any
from uuid import UUID

from tidings.config import QuotaDefaults
from tidings.email.names import domain_name
from tidings.ids import new_id
from tidings.storage import quotas
from tidings.storage.connection import Connection, Row, returned
from tidings.storage.emails import (
    CHANGE,
    CHANGE_ROWS,
    DUE_CHANNEL,
    RECORDED,
    Change,
    Clock,
    change_args,
    event_data,
    recipients_text,
)
from tidings.storage.quota_stripes import fast_claim_sql

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

# What ACCEPT_CHECK finds, as a condition of one statement ($34 the domain
# names, $35 the addresses): every name is a verified sending domain of the
# team and no address is suppressed.
_CHECKED = """
checked AS (
    SELECT NOT EXISTS (SELECT 1 FROM unnest($34::text[]) n
                       WHERE NOT EXISTS (SELECT 1 FROM domains d WHERE d.team_id = $11
                                         AND d.name = n AND d.status = 'verified'))
       AND NOT EXISTS (SELECT 1 FROM unnest($35::text[]) a
                       JOIN suppressions s ON s.team_id = $11 AND s.address = lower(a)) AS ok
)"""


def _claiming_sql(*, check: bool) -> str:
    """ACCEPT and the quota's fast path in one statement ($29 the recipients
    to count, $30/$31 the UTC day and month, $32/$33 the default limits): the
    emails and their events are written only if a stripe counted them (or
    there is nothing to count); otherwise nothing is, and the caller takes
    the slow path. With ``check``, only if ``_CHECKED`` holds too (the emails
    were built with no recipient suppressed); ``checked`` says whether it
    did, and when not the caller checks first."""
    ok = " AND (SELECT ok FROM checked)" if check else ""
    quota, _ = fast_claim_sql(
        ready=f" AND $29::bigint > 0{ok}",
        team="$11::uuid", channel="'email'", n="$29::bigint", day="$30::date",
        month="$31::date", per_day="$32::bigint", per_month="$33::bigint",
    )
    counted = f"(($29::bigint = 0 OR EXISTS (SELECT 1 FROM quota_counted)){ok})"
    return f"""
WITH {_CHECKED + ", " if check else ""}{quota}, change AS ({CHANGE_ROWS} WHERE {counted}),
{INSERTED.format(gate="WHERE " + counted)}, {RECORDED}
SELECT (SELECT woken FROM woken),
       (SELECT count(pg_notify('{DUE_CHANNEL}', $11::text))
        FROM (SELECT 1 FROM inserted WHERE status = 'queued' LIMIT 1) queued) AS senders,
       {counted} AS stored{", (SELECT ok FROM checked) AS checked" if check else ""}
"""


ACCEPT_CLAIMING = _claiming_sql(check=False)
ACCEPT_CHECKED_CLAIMING = _claiming_sql(check=True)


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
    id: UUID = field(default_factory=new_id)

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
        *change_args(changes),
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


@lru_cache(maxsize=1024)
def _domain_key(name: str) -> str:
    try:
        return domain_name(name)
    except ValueError:
        return name


async def _claiming(
    conn: Connection, statement: str, team_id: UUID, emails: Sequence[NewEmail],
    limits: QuotaDefaults, *extra: object,
) -> tuple[Row, list[Any], int]:
    """Run ``statement`` (ACCEPT_CLAIMING or ACCEPT_CHECKED_CLAIMING) for the
    emails: its row, the arguments of ACCEPT and the recipients counted."""
    sending = sum(len(e.send_to) - len(e.suppressed) for e in emails)
    args = _accept_args(team_id, emails)
    quota = quotas.claim_args(team_id, "email", sending, limits, datetime.now(UTC))
    row = await quotas.fast_attempt(
        conn, statement, [*args, *quota[2:], *extra],
        lambda row: row is not None and row["stored"],
    )
    return returned(row), args, sending


async def accept(
    conn: Connection, team_id: UUID, emails: Sequence[NewEmail], limits: QuotaDefaults
) -> list[NewEmail]:
    """Check and store emails as one unit: their domains must be verified
    sending domains of the team (else UnverifiedDomain, nothing stored) and
    suppressed recipients are found; the emails are stored with their first
    events and every recipient who is not suppressed counts against the
    team's email quotas. In one statement when every domain is verified, no
    recipient is suppressed and the quota's fast path takes them; else a
    check, then one statement, or a transaction that takes the quota's slow
    path (QuotaExceeded: nothing stored). Returns them as stored."""
    names = {e.domain: _domain_key(e.domain) for e in emails}
    domains = sorted(set(names.values()))
    addresses = sorted({a for e in emails for a in e.send_to})
    hoped = [
        email if email.domain == names[email.domain] and not email.suppressed
        else replace(email, domain=names[email.domain], suppressed=[])
        for email in emails
    ]
    row, args, sending = await _claiming(
        conn, ACCEPT_CHECKED_CLAIMING, team_id, hoped, limits, domains, addresses
    )
    if row["stored"]:
        return hoped
    checked = hoped
    if not row["checked"]:
        found = returned(await conn.fetchrow(ACCEPT_CHECK, team_id, domains, addresses))
        verified, blocked = set(found["verified"]), set(found["suppressed"])
        checked = []
        for index, email in enumerate(hoped):
            if email.domain not in verified:
                raise UnverifiedDomain(index, emails[index].domain)
            suppressed = [a for a in email.send_to if a in blocked]
            checked.append(replace(email, suppressed=suppressed))
        row, args, sending = await _claiming(conn, ACCEPT_CLAIMING, team_id, checked, limits)
        if row["stored"]:
            return checked
    # No stripe of the quota had room (or all were held): the slow path.
    async with conn.transaction():
        await conn.fetchrow(ACCEPT, *args)
        await quotas.claim(conn, team_id, "email", sending, limits)
    return checked
