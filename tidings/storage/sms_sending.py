"""Sending SMS in PostgreSQL: claim due messages, record attempts and what follows.

A message is due while ``next_attempt_at`` is set and has come: queued
messages at once, scheduled ones at ``scheduled_at``, retries after their
backoff. Due messages are leased rows (``tidings.storage.leases``) owned by
their team: the team's actor claims them, and an attempt is recorded only
while the lease is still this process's, with its status moves, in one
transaction for a whole batch of attempts. Status reports a provider made
before its ids of the batch's messages were stored are applied just after
(``tidings.storage.sms_status``).

What a provider announces for later (the sandbox's statuses and its STOP
reply) is written to ``sms_followups`` in the attempt's transaction and
recorded when due. Every function here runs whole inside ``Database.run``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal
from uuid import UUID

from tidings.ids import new_id
from tidings.providers.sms import SmsStatus
from tidings.sms_keywords import keyword_action
from tidings.storage import sms_consent
from tidings.storage.connection import Connection, Row
from tidings.storage.leases import claim_rows, lease_sql, owners_of
from tidings.storage.rows import Queries
from tidings.storage.sms import DUE_CHANNEL, Report, record_reports
from tidings.storage.sms_status import apply_early_reports

__all__ = ["DUE_CHANNEL"]

LEASES = lease_sql(
    "sms_messages",
    owner="team_id",
    due="t.next_attempt_at",
    pending="t.next_attempt_at IS NOT NULL",
    owners_index="next_attempt_at IS NOT NULL",  # sms_due
    claimed="""
SELECT c.id, c.team_id, c.to_number, c.from_sender, c.body, c.status, c.attempt_count,
       c.send_begun_at,
       EXISTS (SELECT 1 FROM sender_ids s WHERE s.team_id = c.team_id
               AND s.value = c.from_sender AND s.status = 'approved') AS sender_ok,
       EXISTS (SELECT 1 FROM suppressions s WHERE s.team_id = c.team_id
               AND s.address = c.to_number)
       OR EXISTS (SELECT 1 FROM contacts k WHERE k.team_id = c.team_id
                  AND k.normalized_phone = c.to_number
                  AND k.sms_consent_status = 'opted_out') AS opted_out
FROM claimed c
""",
)

# A send begins ($1 the message, $2 the lease owner): marked before the
# request, so that whoever takes the message up after a lost answer does not
# send it again (migration 0025). Nothing when the lease is lost.
BEGIN_SEND = """
UPDATE sms_messages SET send_begun_at = now() WHERE id = $1 AND lease_owner = $2
"""

# $1 the lease owner; per message: id, the next attempt (NULL: done), provider.
RECORD_ATTEMPTS = """
UPDATE sms_messages t SET
    next_attempt_at = r.next_at,
    attempt_count = t.attempt_count + 1,
    provider = r.provider,
    send_begun_at = NULL,
    lease_owner = NULL,
    leased_until = NULL,
    updated_at = now()
FROM unnest($2::uuid[], $3::timestamptz[], $4::text[]) AS r(id, next_at, provider)
WHERE t.id = r.id AND t.lease_owner = $1
RETURNING t.id
"""

INSERT_FOLLOWUPS = """
INSERT INTO sms_followups (sms_id, kind, status, body, code, message, provider, due_at, id)
SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
                     $7::text[], $8::timestamptz[], $9::uuid[])
"""

# Due followups of every team, taken out in the transaction that records
# them, so that a crash loses none and none is recorded twice.
# In the order they fell due: a DELETE returns its rows in no order, and a
# message's statuses are applied in the order given (a ``sent`` after its
# ``delivered`` would be dropped as a move backwards).
TAKE_FOLLOWUPS = """
WITH due AS (
    SELECT id FROM sms_followups WHERE due_at <= now()
    ORDER BY due_at LIMIT $1 FOR UPDATE SKIP LOCKED
), taken AS (
    DELETE FROM sms_followups f USING due, sms_messages m
    WHERE f.id = due.id AND m.id = f.sms_id
    RETURNING f.sms_id, f.kind, f.status, f.body, f.code, f.message, f.provider, f.due_at,
              m.team_id, m.to_number
)
SELECT * FROM taken ORDER BY due_at
"""

FOLLOWUP_DUE_IN = "SELECT extract(epoch FROM min(due_at) - now())::float8 FROM sms_followups"

FollowupKind = Literal["status", "inbound"]


@dataclass(frozen=True)
class Claimed:
    """A due message, leased for one attempt."""

    id: UUID
    team_id: UUID
    to_number: str
    from_sender: str
    body: str
    status: str
    attempt_count: int
    # Set: a send began and its answer was never recorded.
    send_begun_at: datetime | None
    # Whether the sender ID is still approved, and the number not opted out.
    sender_ok: bool
    opted_out: bool

    @classmethod
    def from_row(cls, row: Row) -> Claimed:
        return cls(**{name: row[name] for name in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Followup:
    """A status (``kind`` status) or a reply (``kind`` inbound) due at ``due_at``."""

    sms_id: UUID
    kind: FollowupKind
    due_at: datetime
    provider: str
    status: SmsStatus | None = None
    body: str | None = None
    code: str | None = None
    message: str | None = None


@dataclass(frozen=True)
class Attempted:
    """An attempt's result, recorded while the lease holds: the status reports
    it makes (in order), when to try again (None: done), what follows later."""

    sms: Claimed
    provider: str
    next_at: datetime | None
    reports: list[Report] = field(default_factory=list)
    followups: list[Followup] = field(default_factory=list)


async def due_teams(conn: Queries, limit: int) -> list[UUID]:
    return owners_of(await conn.fetch(LEASES.due_owners, limit))


async def claim(
    conn: Connection, team_id: UUID, owner: UUID, lease_seconds: float, limit: int
) -> tuple[list[Claimed], float | None]:
    """Lease up to ``limit`` due messages of the team; and, when fewer were
    due, the seconds until the team's next one falls due (None: none)."""
    rows = await claim_rows(conn, LEASES.claim, team_id, owner, lease_seconds, limit)
    claimed = [Claimed.from_row(row) for row in rows]
    next_in = None
    if len(claimed) < limit:
        next_in = await conn.fetchval(LEASES.seconds_to_next_due, team_id)
    return claimed, next_in


async def begin_send(conn: Connection, sms_id: UUID, owner: UUID) -> bool:
    """Mark the send of ``sms_id`` begun; False if its lease is no longer ``owner``'s."""
    return str(await conn.execute(BEGIN_SEND, sms_id, owner)) == "UPDATE 1"


async def release(conn: Connection, ids: Sequence[UUID], owner: UUID) -> None:
    await conn.execute(LEASES.release, list(ids), owner)


async def record_attempts(
    conn: Connection, owner: UUID, done: Sequence[Attempted], *, calls_back: bool = True
) -> int:
    """Record attempts whose lease this process still holds, with their
    status moves and followups, in one transaction; returns how many. Then,
    for a provider that ``calls_back`` with statuses, apply what it reported
    for the ids just stored before they were (one more statement when there
    are ids, whether or not any report waits). Cancelled between the two,
    the reports wait for the retention sweeper."""
    async with conn.transaction():
        rows = await conn.fetch(
            RECORD_ATTEMPTS,
            owner,
            [a.sms.id for a in done],
            [a.next_at for a in done],
            [a.provider for a in done],
        )
        held = {row["id"] for row in rows}
        kept = [a for a in done if a.sms.id in held]
        await record_reports(conn, [r for a in kept for r in a.reports])
        # A provider's refusal of a number that opted out with it is its STOP.
        stopped = [a.sms for a in kept for r in a.reports if r.status == "rejected"
                   and (r.provider, r.code) in sms_consent.PROVIDER_OPT_OUTS]
        if stopped:
            await sms_consent.hold_consent_lock(conn, sorted({s.team_id for s in stopped}))
            for sms in stopped:
                await sms_consent.opt_out(conn, [sms.team_id], sms.to_number, sms.id)
        followups = [f for a in kept for f in a.followups]
        if followups:
            await conn.execute(
                INSERT_FOLLOWUPS,
                [f.sms_id for f in followups],
                [f.kind for f in followups],
                [f.status for f in followups],
                [f.body for f in followups],
                [f.code for f in followups],
                [f.message for f in followups],
                [f.provider for f in followups],
                [f.due_at for f in followups],
                [new_id() for _ in followups],
            )
    # After the commit, never inside it: a callback that kept its report while
    # this transaction was open could not see the ids, and counts on this look.
    if calls_back:
        stored = {r.message_id for a in kept for r in a.reports if r.message_id is not None}
        await apply_early_reports(conn, sorted(stored))
    return len(kept)


async def record_due_followups(conn: Connection, limit: int) -> tuple[int, float | None]:
    """Record up to ``limit`` due followups in one transaction: statuses as
    reports, replies as consent keywords; how many, and the seconds until
    the next one falls due (None: none left)."""
    async with conn.transaction():
        rows = await claim_rows(conn, TAKE_FOLLOWUPS, limit)
        reports = [
            Report(row["sms_id"], row["status"], row["provider"], row["code"], row["message"],
                   occurred_at=row["due_at"])
            for row in rows if row["kind"] == "status"
        ]
        await record_reports(conn, reports)
        # Every team's consent lock at once, in the one order keywords use:
        # taken row by row, two processes' batches could each hold a lock
        # the other waits for.
        keywords = [row for row in rows if row["kind"] == "inbound"
                    and keyword_action(row["body"] or "") in ("opt_out", "opt_in")]
        if keywords:
            await sms_consent.hold_consent_lock(conn, sorted({row["team_id"] for row in keywords}))
        for row in keywords:
            action = keyword_action(row["body"] or "")
            if action == "opt_out":
                await sms_consent.opt_out(conn, [row["team_id"]], row["to_number"], row["sms_id"])
            elif action == "opt_in":
                await sms_consent.opt_in(conn, [row["team_id"]], row["to_number"])
    next_in = await conn.fetchval(FOLLOWUP_DUE_IN)
    return len(rows), next_in


async def followups_due(conn: Queries, limit: int) -> list[str]:
    """The dispatcher's poll: one key while any followup is due."""
    due = await conn.fetchval(FOLLOWUP_DUE_IN)
    return ["followups"] if isinstance(due, float) and due <= 0 else []
