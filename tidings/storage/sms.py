"""SMS messages of a team: acceptance, reading, rescheduling, canceling, and
every status move, whoever reports it.

A message's ``status`` only moves forward (``tidings.sms_states``). Every
move writes, in one transaction: the message's row, an ``sms_events`` row
and the webhook event ``message.<status>`` with channel ``sms``
(``tidings.storage.events``), which share one id. Reports that are not
moves (late, repeated, or after a final status) are dropped and logged.

Functions that write several statements open a transaction (a savepoint
inside the caller's); all of them run whole inside ``Database.run`` or
``run_on``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

from tidings.config import QuotaDefaults
from tidings.providers.sms import SmsStatus
from tidings.sms_states import FINAL, may_move
from tidings.storage import quotas
from tidings.storage.connection import Connection, Row
from tidings.storage.emails import Clock
from tidings.storage.events import FANOUT
from tidings.webhooks.catalogue import EVENT_TYPES

log = logging.getLogger("tidings.sms")

CHANNEL = "sms"
# Every process LISTENs here; the payload is the id of a team with an SMS due now.
DUE_CHANNEL = "tidings_sms_due"

SMS_COLUMNS = """
id, team_id, to_number, country, from_sender, body, encoding, segments, status, provider,
message_id, metadata::text AS metadata, scheduled_at, failure_code, failure_message,
submitted_at, delivered_at, attempt_count, created_at, updated_at
"""

# Status moves, set-based: the SMS events and, with the same ids, the webhook
# events and their deliveries. $1..$10: one array per column of ``change``.
CHANGE = """
change AS (
    SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::text[], $5::text[],
                         $6::timestamptz[], $7::text[], $8::text[], $9::text[], $10::jsonb[])
        AS c(id, sms_id, team_id, status, recipient, occurred_at, provider, code, message, data)
)"""
RECORDED = f"""
sms_event AS (
    INSERT INTO sms_events (id, sms_id, team_id, status, occurred_at, provider, code, message)
    SELECT id, sms_id, team_id, status, occurred_at, provider, code, message FROM change
), event AS (
    INSERT INTO events (id, team_id, type, channel, message_id, recipient, occurred_at, data)
    SELECT id, team_id, 'message.' || status, '{CHANNEL}', sms_id, recipient, occurred_at, data
    FROM change
    RETURNING id, team_id, type
), {FANOUT}"""
RECORD_CHANGES = f"WITH {CHANGE}, {RECORDED} SELECT woken FROM woken"

# Which sender IDs of the team ($1) the `from` names ($2: its spellings), the
# approved one first, and whether the recipient ($3, E.164) opted out or is
# suppressed.
ACCEPT_CHECK = """
SELECT (SELECT value FROM sender_ids WHERE team_id = $1 AND value = ANY($2::text[])
        ORDER BY status = 'approved' DESC LIMIT 1) AS sender,
       (SELECT status FROM sender_ids WHERE team_id = $1 AND value = ANY($2::text[])
        ORDER BY status = 'approved' DESC LIMIT 1) AS sender_status,
       EXISTS (SELECT 1 FROM suppressions WHERE team_id = $1 AND address = $3)
       OR EXISTS (SELECT 1 FROM contacts WHERE team_id = $1 AND normalized_phone = $3
                  AND sms_consent_status = 'opted_out') AS opted_out
"""

# The message ($11..) with its first event; its team's senders are woken
# when (and only if) it commits and it is due now.
ACCEPT = f"""
WITH {CHANGE}, inserted AS (
    INSERT INTO sms_messages (id, team_id, to_number, country, from_sender, body, encoding,
                              segments, status, provider, metadata, scheduled_at,
                              next_attempt_at, created_at, updated_at)
    VALUES ($11, $12, $13, $14, $15, $16, $17, $18, 'queued', $19, $20::jsonb, $21,
            coalesce($21, now()), now(), now())
    RETURNING {SMS_COLUMNS}
), {RECORDED}
SELECT inserted.*, (SELECT woken FROM woken),
       (SELECT count(pg_notify('{DUE_CHANNEL}', $12::text)) WHERE $21::timestamptz IS NULL)
           AS senders
FROM inserted
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

# The messages that reports name, locked: moves are decided against the
# status as it is, one transaction at a time.
LOCK = """
SELECT id, team_id, to_number, from_sender, segments, status, message_id
FROM sms_messages WHERE id = ANY($1::uuid[]) ORDER BY id FOR UPDATE
"""

APPLY = """
UPDATE sms_messages t SET
    status = u.status,
    message_id = coalesce(u.message_id, t.message_id),
    failure_code = coalesce(u.failure_code, t.failure_code),
    failure_message = coalesce(u.failure_message, t.failure_message),
    submitted_at = coalesce(t.submitted_at, u.submitted_at),
    delivered_at = coalesce(t.delivered_at, u.delivered_at),
    next_attempt_at = CASE WHEN u.final THEN NULL ELSE t.next_attempt_at END,
    updated_at = now()
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::timestamptz[],
            $7::timestamptz[], $8::bool[])
     AS u(id, status, message_id, failure_code, failure_message, submitted_at, delivered_at,
          final)
WHERE t.id = u.id
"""

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
    id: UUID = field(default_factory=uuid4)


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


@dataclass(frozen=True)
class Report:
    """A status of a message as someone reported it (a provider, a callback,
    the canceling client). ``message_id`` is the provider's id, if it says."""

    sms_id: UUID
    status: SmsStatus
    provider: str | None
    code: str | None = None
    message: str | None = None
    message_id: str | None = None
    occurred_at: datetime | None = None


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


def event_data(
    sms_id: UUID, sender: str, to: str, segments: int, status: str, **more: Any
) -> dict[str, Any]:
    """The ``data`` of a webhook event about a text message."""
    data = {"sms_id": str(sms_id), "from": sender, "to": to, "segments": segments,
            "status": status}
    data.update({key: value for key, value in more.items() if value is not None})
    return data


@dataclass(frozen=True)
class Change:
    """One status move: its SMS event and its webhook event share ``id``."""

    sms_id: UUID
    team_id: UUID
    status: str
    recipient: str
    occurred_at: datetime
    provider: str | None
    data: dict[str, Any]
    code: str | None = None
    message: str | None = None
    id: UUID = field(default_factory=uuid4)


def _change_args(changes: Sequence[Change]) -> list[Any]:
    for c in changes:
        if f"message.{c.status}" not in EVENT_TYPES:
            raise ValueError(f"message.{c.status} is not an event type of the catalogue")
    return [
        [c.id for c in changes],
        [c.sms_id for c in changes],
        [c.team_id for c in changes],
        [c.status for c in changes],
        [c.recipient for c in changes],
        [c.occurred_at for c in changes],
        [c.provider for c in changes],
        [c.code for c in changes],
        [c.message for c in changes],
        [json.dumps(c.data) for c in changes],
    ]


async def accept(
    conn: Connection, team_id: UUID, sms: NewSms, defaults: QuotaDefaults
) -> Sms:
    """Check and store one message with its ``queued`` event, and count it
    against the team's quota, as one unit: SenderNotApproved, OptedOut or
    QuotaExceeded leave nothing behind."""
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
        row = await conn.fetchrow(
            ACCEPT,
            *_change_args([change]),
            sms.id, team_id, sms.to, sms.country, sender, sms.body, sms.encoding,
            sms.segments, sms.provider,
            None if sms.metadata is None else json.dumps(sms.metadata),
            sms.scheduled_at,
        )
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
        await record_reports(conn, [Report(sms_id, "canceled", None)])
        return await get_sms(conn, team_id, sms_id)


@dataclass
class _Moving:
    """A locked message and what the reports about it change."""

    row: Row
    status: str
    changes: list[Change] = field(default_factory=list)
    message_id: str | None = None
    failure: tuple[str | None, str | None] = (None, None)
    submitted_at: datetime | None = None
    delivered_at: datetime | None = None


def _apply(moving: _Moving, report: Report, at: datetime) -> None:
    row = moving.row
    if report.message_id is not None:
        moving.message_id = report.message_id
    if not may_move(moving.status, report.status):
        log.info("sms %s: ignored %s after %s", report.sms_id, report.status, moving.status)
        return
    moving.status = report.status
    if report.status in ("submitted", "sent") and moving.submitted_at is None:
        moving.submitted_at = at
    if report.status == "delivered":
        moving.delivered_at = at
    if report.status in FINAL and report.status != "delivered":
        moving.failure = (report.code, report.message)
    data = event_data(
        row["id"], row["from_sender"], row["to_number"], row["segments"], report.status,
        provider_message_id=moving.message_id or row["message_id"],
        code=report.code, message=report.message,
    )
    moving.changes.append(Change(
        row["id"], row["team_id"], report.status, row["to_number"], at, report.provider,
        data, code=report.code, message=report.message,
    ))


async def record_reports(conn: Connection, reports: Sequence[Report]) -> list[Change]:
    """Apply reports in order: the moves they make, each with its events, and
    the provider ids they carry; the rest are ignored. Reports of messages
    that do not exist are skipped. Returns the moves made."""
    if not reports:
        return []
    async with conn.transaction():
        rows = await conn.fetch(LOCK, list({r.sms_id for r in reports}))
        moving = {row["id"]: _Moving(row, row["status"]) for row in rows}
        clock = Clock()
        for report in reports:
            found = moving.get(report.sms_id)
            if found is not None:
                _apply(found, report, report.occurred_at or clock.tick())
        touched = [m for m in moving.values() if m.changes or m.message_id]
        if touched:
            await conn.execute(
                APPLY,
                [m.row["id"] for m in touched],
                [m.status for m in touched],
                [m.message_id for m in touched],
                [m.failure[0] for m in touched],
                [m.failure[1] for m in touched],
                [m.submitted_at for m in touched],
                [m.delivered_at for m in touched],
                [m.status in FINAL for m in touched],
            )
        changes = [c for m in touched for c in m.changes]
        if changes:
            await conn.fetchval(RECORD_CHANGES, *_change_args(changes))
    return changes


async def sms_by_provider_id(conn: Connection, message_id: str) -> UUID | None:
    found = await conn.fetchval(BY_PROVIDER_ID, message_id)
    return found if isinstance(found, UUID) else None
