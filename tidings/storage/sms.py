"""SMS messages of a team: acceptance, reading, rescheduling and canceling.

Status moves, and the events each records, are in ``tidings.storage.sms_status``.

Functions that write several statements open a transaction (a savepoint
inside the caller's); all of them run whole inside ``Database.run`` or
``run_on``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from tidings.config import QuotaDefaults
from tidings.ids import new_id
from tidings.storage import quotas
from tidings.storage.connection import Connection, Row, returned
from tidings.storage.emails import Clock
from tidings.storage.quota_stripes import fast_claim_sql
from tidings.storage.sms_status import (
    CHANGE,
    RECORDED,
    Change,
    Report,
    change_args,
    event_data,
    record_reports,
)

__all__ = ["Report", "record_reports"]

# Every process LISTENs here; the payload is the id of a team with an SMS due now.
DUE_CHANNEL = "tidings_sms_due"

SMS_COLUMNS = """
id, team_id, to_number, country, from_sender, body, encoding, segments, status, provider,
message_id, metadata::text AS metadata, scheduled_at, failure_code, failure_message,
submitted_at, delivered_at, attempt_count, created_at, updated_at
"""

# Which sender IDs of the team ($1) the `from` names ($2: its spellings), the
# approved one first, and whether the recipient ($3, E.164) opted out or is
# suppressed.
CHECK = """
SELECT (SELECT value FROM sender_ids WHERE team_id = {team} AND value = ANY({spellings})
        ORDER BY status = 'approved' DESC LIMIT 1) AS sender,
       (SELECT status FROM sender_ids WHERE team_id = {team} AND value = ANY({spellings})
        ORDER BY status = 'approved' DESC LIMIT 1) AS sender_status,
       EXISTS (SELECT 1 FROM suppressions WHERE team_id = {team} AND address = {to})
       OR EXISTS (SELECT 1 FROM contacts WHERE team_id = {team} AND normalized_phone = {to}
                  AND sms_consent_status = 'opted_out') AS opted_out
"""
ACCEPT_CHECK = CHECK.format(team="$1", spellings="$2::text[]", to="$3")

# A message is never younger than its first event ($6: its time, from the
# service's clock as every event's is).
_CREATED = "least(now(), ($6::timestamptz[])[1])"

# The message ($11..) with its first event; its team's senders are woken
# when (and only if) it commits and it is due now.
ACCEPT = f"""
WITH {CHANGE}, inserted AS (
    INSERT INTO sms_messages (id, team_id, to_number, country, from_sender, body, encoding,
                              segments, status, provider, metadata, scheduled_at,
                              next_attempt_at, created_at, updated_at)
    VALUES ($11, $12, $13, $14, $15, $16, $17, $18, 'queued', $19, $20::jsonb, $21,
            coalesce($21, now()), {_CREATED}, now())
    RETURNING {SMS_COLUMNS}
), {RECORDED}
SELECT inserted.*, (SELECT woken FROM woken),
       (SELECT count(pg_notify('{DUE_CHANNEL}', $12::text)) WHERE $21::timestamptz IS NULL)
           AS senders
FROM inserted
"""

# The common case in one statement: the check above ($12 team, $26 the
# spellings of `from`, $13 the number), the quota's fast path ($22/$23 the UTC
# day and month, $24/$25 the default limits), and, only when the check passed
# and a stripe counted the message, ACCEPT's message and event (the event's
# `from` is the sender ID as stored). Nothing is written otherwise: the caller
# learns why from the check, or takes the slow path (``accept``).
_QUOTA, _ = fast_claim_sql(
    ready=" AND (SELECT ready FROM checked)",
    team="$12::uuid", channel="'sms'", n="1::bigint", day="$22::date", month="$23::date",
    per_day="$24::bigint", per_month="$25::bigint",
)
ACCEPT_CLAIMING = f"""
WITH checked AS (
    SELECT c.*, c.sender_status = 'approved' AND NOT c.opted_out AS ready
    FROM ({CHECK.format(team="$12::uuid", spellings="$26::text[]", to="$13::text")}) c
), {_QUOTA}, change AS (
    SELECT c.id, c.sms_id, c.team_id, c.status, c.recipient, c.occurred_at, c.provider, c.code,
           c.message, c.data || jsonb_build_object('from', (SELECT sender FROM checked)) AS data
    FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::text[], $5::text[],
                $6::timestamptz[], $7::text[], $8::text[], $9::text[], $10::jsonb[])
        AS c(id, sms_id, team_id, status, recipient, occurred_at, provider, code, message, data)
    WHERE EXISTS (SELECT 1 FROM quota_counted)
), inserted AS (
    INSERT INTO sms_messages (id, team_id, to_number, country, from_sender, body, encoding,
                              segments, status, provider, metadata, scheduled_at,
                              next_attempt_at, created_at, updated_at)
    SELECT $11, $12, $13, $14, coalesce(checked.sender, $15::text), $16, $17, $18, 'queued',
           $19, $20::jsonb, $21, coalesce($21, now()), {_CREATED}, now()
    FROM checked WHERE EXISTS (SELECT 1 FROM quota_counted)
    RETURNING {SMS_COLUMNS}
), {RECORDED}
SELECT checked.sender_status AS checked_status, checked.opted_out AS checked_opted_out,
       inserted.*, (SELECT woken FROM woken),
       (SELECT count(pg_notify('{DUE_CHANNEL}', $12::text)) FROM inserted
        WHERE $21::timestamptz IS NULL) AS senders
FROM checked LEFT JOIN inserted ON true
"""

SELECT_SMS = f"SELECT {SMS_COLUMNS} FROM sms_messages WHERE team_id = $1 AND id = $2"

# Only a queued message with a future send time that no process has taken up.
STILL_SCHEDULED = """
status = 'queued' AND scheduled_at > now()
AND (leased_until IS NULL OR leased_until < now())
"""
RESCHEDULE = f"""
UPDATE sms_messages SET scheduled_at = $3, next_attempt_at = $3, updated_at = now()
WHERE team_id = $1 AND id = $2 AND {STILL_SCHEDULED}
RETURNING {SMS_COLUMNS}
"""
# The cancel itself is a status move (record_reports); this only checks and
# stops the send.
STOP_SCHEDULED = f"""
UPDATE sms_messages SET next_attempt_at = NULL
WHERE team_id = $1 AND id = $2 AND {STILL_SCHEDULED}
RETURNING id
"""
STATUS_OF = "SELECT status, scheduled_at FROM sms_messages WHERE team_id = $1 AND id = $2"

BY_PROVIDER_ID = "SELECT id FROM sms_messages WHERE message_id = $1"


@dataclass(frozen=True)
class NewSms:
    """A message checked and ready to store."""

    to: str
    country: str | None
    sender_candidates: list[str]
    body: str
    encoding: str
    segments: int
    provider: str
    metadata: dict[str, Any] | None
    scheduled_at: datetime | None
    id: UUID = field(default_factory=new_id)


@dataclass(frozen=True)
class Sms:
    id: UUID
    team_id: UUID
    to_number: str
    country: str | None
    from_sender: str
    body: str
    encoding: str
    segments: int
    status: str
    provider: str
    message_id: str | None
    metadata: dict[str, Any] | None
    scheduled_at: datetime | None
    failure_code: str | None
    failure_message: str | None
    submitted_at: datetime | None
    delivered_at: datetime | None
    attempt_count: int
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: Row) -> Sms:
        values = {name: row[name] for name in cls.__dataclass_fields__}
        metadata = values["metadata"]
        values["metadata"] = None if metadata is None else json.loads(metadata)
        return cls(**values)


class SenderNotApproved(Exception):
    """``from`` is not an approved sender ID of the team (``status`` None: none at all)."""

    def __init__(self, status: str | None) -> None:
        super().__init__(status)
        self.status = status


class OptedOut(Exception):
    """The recipient replied STOP, has opted out as a contact, or is suppressed."""


class NotScheduled(Exception):
    """The message exists but no longer waits for a future ``scheduled_at``."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


async def accept(
    conn: Connection, team_id: UUID, sms: NewSms, defaults: QuotaDefaults
) -> Sms:
    """Check and store one message with its ``queued`` event, and count it
    against the team's quota, as one unit: SenderNotApproved, OptedOut or
    QuotaExceeded leave nothing behind. One statement when the quota's fast
    path takes it; else a transaction that takes the slow path."""
    now = Clock().tick()
    change = Change(sms.id, team_id, "queued", sms.to, now, sms.provider,
                    event_data(sms.id, sms.sender_candidates[0], sms.to, sms.segments, "queued"))
    args = [*change_args([change]), *_message_args(team_id, sms),
            *quotas.claim_args(team_id, "sms", 1, defaults, now)[3:], sms.sender_candidates]
    row = returned(await quotas.fast_attempt(
        conn, ACCEPT_CLAIMING, args, lambda row: row is not None and row["id"] is not None
    ))
    if row["checked_status"] != "approved":
        raise SenderNotApproved(row["checked_status"])
    if row["checked_opted_out"]:
        raise OptedOut(sms.to)
    if row["id"] is not None:
        return Sms.from_row(row)
    return await _accept_in_steps(conn, team_id, sms, defaults)


def _message_args(team_id: UUID, sms: NewSms) -> list[Any]:
    """$11..$21 of ACCEPT: the message; $15 is the sender (ACCEPT_CLAIMING: the check's)."""
    return [
        sms.id, team_id, sms.to, sms.country, None, sms.body, sms.encoding, sms.segments,
        sms.provider, None if sms.metadata is None else json.dumps(sms.metadata),
        sms.scheduled_at,
    ]


async def _accept_in_steps(
    conn: Connection, team_id: UUID, sms: NewSms, defaults: QuotaDefaults
) -> Sms:
    """``accept`` when no stripe of the quota had room (or all were held): the
    check, the message and the claim in one transaction."""
    async with conn.transaction():
        check = await conn.fetchrow(ACCEPT_CHECK, team_id, sms.sender_candidates, sms.to)
        assert check is not None
        if check["sender_status"] != "approved":
            raise SenderNotApproved(check["sender_status"])
        if check["opted_out"]:
            raise OptedOut(sms.to)
        sender: str = check["sender"]
        at = Clock().tick()
        data = event_data(sms.id, sender, sms.to, sms.segments, "queued")
        change = Change(sms.id, team_id, "queued", sms.to, at, sms.provider, data)
        args = _message_args(team_id, sms)
        args[4] = sender
        row = await conn.fetchrow(ACCEPT, *change_args([change]), *args)
        assert row is not None
        await quotas.claim(conn, team_id, "sms", 1, defaults)
    return Sms.from_row(row)


async def get_sms(conn: Connection, team_id: UUID, sms_id: UUID) -> Sms | None:
    row = await conn.fetchrow(SELECT_SMS, team_id, sms_id)
    return None if row is None else Sms.from_row(row)


async def _not_scheduled(conn: Connection, team_id: UUID, sms_id: UUID) -> None:
    row = await conn.fetchrow(STATUS_OF, team_id, sms_id)
    if row is not None:
        raise NotScheduled(row["status"])


async def reschedule(
    conn: Connection, team_id: UUID, sms_id: UUID, scheduled_at: datetime
) -> Sms | None:
    """Move a scheduled message's send; None if there is no such message.
    Raises NotScheduled unless it is queued with a future ``scheduled_at``."""
    row = await conn.fetchrow(RESCHEDULE, team_id, sms_id, scheduled_at)
    if row is None:
        await _not_scheduled(conn, team_id, sms_id)
        return None
    return Sms.from_row(row)


async def cancel(conn: Connection, team_id: UUID, sms_id: UUID) -> Sms | None:
    """Cancel a scheduled message (status ``canceled``, with its event); None if
    there is no such message. Raises NotScheduled unless it is queued with a
    future ``scheduled_at``."""
    async with conn.transaction():
        if await conn.fetchval(STOP_SCHEDULED, team_id, sms_id) is None:
            await _not_scheduled(conn, team_id, sms_id)
            return None
        await record_reports(conn, [Report(
            sms_id, "canceled", None, "canceled", "canceled by the team before it was sent"
        )])
        return await get_sms(conn, team_id, sms_id)


async def sms_by_provider_id(conn: Connection, message_id: str) -> UUID | None:
    found = await conn.fetchval(BY_PROVIDER_ID, message_id)
    return found if isinstance(found, UUID) else None
