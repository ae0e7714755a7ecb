"""Status moves of SMS messages, whoever reports them (the send worker, a
provider's callback, a sync, a cancel).

A message's ``status`` only moves forward (``tidings.sms_states``). Every
move writes, in one transaction: the message's row, an ``sms_events`` row
and the webhook event ``message.<status>`` with channel ``sms``
(``tidings.storage.events``), which share one id. Reports that are not
moves (late, repeated, or after a final status) are dropped and logged.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

from tidings.providers.sms import SmsStatus
from tidings.sms_states import FINAL, furthest, may_move
from tidings.storage.connection import Connection, Row
from tidings.storage.emails import Clock
from tidings.storage.events import FANOUT
from tidings.webhooks.catalogue import EVENT_TYPES

log = logging.getLogger("tidings.sms")

CHANNEL = "sms"

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

# The messages that reports name, locked: moves are decided against the
# status as it is, one transaction at a time.
LOCK = """
SELECT id, team_id, to_number, from_sender, segments, status, message_id,
       CASE WHEN status = 'unknown' THEN ARRAY(
           SELECT e.status FROM sms_events e WHERE e.sms_id = m.id
       ) ELSE '{}' END AS earlier
FROM sms_messages m WHERE id = ANY($1::uuid[]) ORDER BY id FOR UPDATE
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
    -- Never before a time the move itself records.
    updated_at = greatest(now(), u.submitted_at, u.delivered_at)
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::timestamptz[],
            $7::timestamptz[], $8::bool[])
     AS u(id, status, message_id, failure_code, failure_message, submitted_at, delivered_at,
          final)
WHERE t.id = u.id
"""


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


def change_args(changes: Sequence[Change]) -> list[Any]:
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


@dataclass
class _Moving:
    """A locked message and what the reports about it change."""

    row: Row
    status: str
    # The furthest of queued to sent that the message has been in.
    reached: str | None
    changes: list[Change] = field(default_factory=list)
    message_id: str | None = None
    failure: tuple[str | None, str | None] = (None, None)
    submitted_at: datetime | None = None
    delivered_at: datetime | None = None


def _apply(moving: _Moving, report: Report, at: datetime) -> None:
    row = moving.row
    if report.message_id is not None:
        moving.message_id = report.message_id
    if not may_move(moving.status, report.status, moving.reached):
        log.info("sms %s: ignored %s after %s", report.sms_id, report.status, moving.status)
        return
    moving.status = report.status
    moving.reached = furthest([report.status, moving.reached or report.status])
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
        moving = {
            row["id"]: _Moving(row, row["status"], furthest([row["status"], *row["earlier"]]))
            for row in rows
        }
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
            await conn.fetchval(RECORD_CHANGES, *change_args(changes))
    return changes
