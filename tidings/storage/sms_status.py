"""Status moves of SMS messages, whoever reports them (the send worker, a
provider's callback, a sync, a cancel).

A message's ``status`` only moves forward (``tidings.sms_states``). Every
move writes, in one transaction: the message's row, an ``sms_events`` row
and the webhook event ``message.<status>`` with channel ``sms``
(``tidings.storage.events``), which share one id. Reports that are not
moves (late, repeated, or after a final status) are dropped and logged.

A provider may report a status before the send worker has stored the
provider's id of the message (Twilio calls back as soon as it has answered
the send; the worker records answers in batches). Such a report is kept in
``sms_early_reports`` and applied once the id is stored: the callback keeps
it and commits, then looks again; the worker, after committing the ids it
stored, looks for reports kept for them. Whichever commits second sees the
other's row, so no report is lost, and each is taken out with
``DELETE ... RETURNING`` in the transaction that applies it, so none is
applied twice.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from tidings.ids import new_id
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
CHANGE_ROWS = """
    SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::text[], $5::text[],
                         $6::timestamptz[], $7::text[], $8::text[], $9::text[], $10::jsonb[])
        AS c(id, sms_id, team_id, status, recipient, occurred_at, provider, code, message, data)
"""
CHANGE = f"change AS ({CHANGE_ROWS})"
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
    failure_code = CASE WHEN u.moved THEN u.failure_code ELSE t.failure_code END,
    failure_message = CASE WHEN u.moved THEN u.failure_message ELSE t.failure_message END,
    submitted_at = coalesce(t.submitted_at, u.submitted_at),
    delivered_at = coalesce(t.delivered_at, u.delivered_at),
    next_attempt_at = CASE WHEN u.final THEN NULL ELSE t.next_attempt_at END,
    -- Never before a time the move itself records.
    updated_at = greatest(now(), u.submitted_at, u.delivered_at)
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::timestamptz[],
            $7::timestamptz[], $8::bool[], $9::bool[])
     AS u(id, status, message_id, failure_code, failure_message, submitted_at, delivered_at,
          final, moved)
WHERE t.id = u.id
"""

# The failure of a report that gives no code or no message (a Twilio
# callback ``MessageStatus=failed`` without ``ErrorCode``, a cancel without
# a word): a failure always says what happened and who said so.
UNEXPLAINED: dict[str, tuple[str, str]] = {
    "canceled": ("canceled", "canceled by the provider"),
    "failed": ("failed", "reported failed by the provider"),
    "undelivered": ("undelivered", "reported undelivered by the provider"),
    "expired": ("expired", "reported expired by the provider"),
    "rejected": ("rejected", "reported rejected by the provider"),
}

SMS_OF_PROVIDER_ID = "SELECT id FROM sms_messages WHERE message_id = $1"

KEEP_EARLY = """
INSERT INTO sms_early_reports (message_id, provider, status, code, message)
VALUES ($1, $2, $3, $4, $5)
"""

EARLY_WAITING = """
SELECT EXISTS (SELECT 1 FROM sms_early_reports WHERE message_id = ANY($1::text[]))
"""

# The kept reports of these provider ids whose message now has the id.
TAKE_EARLY = """
DELETE FROM sms_early_reports e USING sms_messages m
WHERE e.message_id = ANY($1::text[]) AND m.message_id = e.message_id
RETURNING e.id, m.id AS sms_id, e.provider, e.status, e.code, e.message
"""

# Kept reports at least $1 seconds old whose message has the id by now: left
# behind by a callback or a send worker that stopped between its two steps.
TAKE_LEFT_BEHIND = """
WITH left_behind AS (
    SELECT e.id, m.id AS sms_id
    FROM sms_early_reports e JOIN sms_messages m ON m.message_id = e.message_id
    WHERE e.received_at < now() - $1 * interval '1 second'
    ORDER BY e.id LIMIT $2
    FOR UPDATE OF e SKIP LOCKED
)
DELETE FROM sms_early_reports e USING left_behind l WHERE e.id = l.id
RETURNING e.id, l.sms_id, e.provider, e.status, e.code, e.message
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


@dataclass(frozen=True)
class ProviderReport:
    """A status a provider reported for its own id of a message (a status
    callback), which may come before that id is stored."""

    message_id: str
    status: SmsStatus
    provider: str
    code: str | None = None
    message: str | None = None


def event_data(
    sms_id: UUID, sender: str, to: str, segments: int, status: str, **more: Any
) -> dict[str, Any]:
    """The ``data`` of a webhook event about a text message: every key is
    there, null where it does not apply (yet)."""
    data = {"sms_id": str(sms_id), "from": sender, "to": to, "segments": segments,
            "status": status, "provider_message_id": None, "code": None, "message": None}
    data.update(more)
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
    id: UUID = field(default_factory=new_id)


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
    code, message = report.code, report.message
    if report.status in UNEXPLAINED:
        default = UNEXPLAINED[report.status]
        code, message = code or default[0], message or default[1]
    moving.status = report.status
    moving.reached = furthest([report.status, moving.reached or report.status])
    if report.status in ("submitted", "sent") and moving.submitted_at is None:
        moving.submitted_at = at
    if report.status == "delivered":
        moving.delivered_at = at
    # The failure is the last move's: a final one's, or why the message is
    # ``unknown`` (an answer that could not be read), until it moves on.
    failing = report.status == "unknown" or report.status in UNEXPLAINED
    moving.failure = (code, message) if failing else (None, None)
    data = event_data(
        row["id"], row["from_sender"], row["to_number"], row["segments"], report.status,
        provider_message_id=moving.message_id or row["message_id"], code=code, message=message,
    )
    moving.changes.append(Change(
        row["id"], row["team_id"], report.status, row["to_number"], at, report.provider,
        data, code=code, message=message,
    ))


async def record_reports(conn: Connection, reports: Sequence[Report]) -> list[Change]:
    """Apply reports in order: the moves they make, each with its events, and
    the provider ids they carry; the rest are ignored. Reports of messages
    that do not exist are skipped. Returns the moves made."""
    if not reports:
        return []
    async with conn.transaction():
        return await _record(conn, reports)


async def _record(conn: Connection, reports: Sequence[Report]) -> list[Change]:
    """``record_reports`` inside the caller's transaction."""
    if not reports:
        return []
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
            [bool(m.changes) for m in touched],
        )
    changes = [c for m in touched for c in m.changes]
    if changes:
        await conn.fetchval(RECORD_CHANGES, *change_args(changes))
    return changes


def _early(rows: Sequence[Row]) -> list[Report]:
    """Kept reports, in the order they arrived. They are recorded when
    applied, after the moves the send worker recorded with their id."""
    return [
        Report(row["sms_id"], row["status"], row["provider"], row["code"], row["message"])
        for row in sorted(rows, key=lambda row: row["id"])
    ]


async def record_provider_report(
    conn: Connection, report: ProviderReport, named: UUID | None = None
) -> tuple[list[Change], bool]:
    """Apply a status a provider reported for its id of a message, after the
    reports kept for that id before it; when no message has that id yet, keep
    it for when one has. ``named``: the message the callback's signed URL
    names, which takes the id when it has none (its send's answer was lost).
    Returns the moves made, and whether the report was kept for later.

    Cancelled after keeping it, the report waits in ``sms_early_reports`` for
    the send worker or the retention sweeper."""
    sms_id = await conn.fetchval(SMS_OF_PROVIDER_ID, report.message_id)
    if sms_id is None and named is not None:
        sms_id = await conn.fetchval(ADOPT_PROVIDER_ID, named, report.message_id)
    if sms_id is None:
        # Committed on its own, before the second look: if that look misses
        # the id too, the worker commits it later and its own look finds this.
        await conn.execute(KEEP_EARLY, report.message_id, report.provider, report.status,
                           report.code, report.message)
    async with conn.transaction():
        rows = await conn.fetch(TAKE_EARLY, [report.message_id])
        reports = _early(rows)
        if sms_id is not None:
            reports.append(Report(sms_id, report.status, report.provider, report.code,
                                  report.message))
        changes = await _record(conn, reports)
    return changes, sms_id is None and not rows


# A message without a provider id takes the one a callback naming it reports.
ADOPT_PROVIDER_ID = """
UPDATE sms_messages SET message_id = $2, updated_at = now()
WHERE id = $1 AND message_id IS NULL
RETURNING id
"""


async def apply_early_reports(conn: Connection, message_ids: Sequence[str]) -> list[Change]:
    """Apply the reports kept for these provider ids, which the caller has
    just stored (and committed). One look-up when none was kept; the moves
    made. Cancelled, the reports not yet applied stay kept."""
    if not message_ids or not await conn.fetchval(EARLY_WAITING, list(message_ids)):
        return []
    async with conn.transaction():
        return await _record(conn, _early(await conn.fetch(TAKE_EARLY, list(message_ids))))


async def apply_left_behind_reports(conn: Connection, age_seconds: float, batch: int) -> int:
    """Apply kept reports at least ``age_seconds`` old whose message has its
    provider id by now, ``batch`` per transaction; how many were applied.
    They were left by a callback or a send worker that stopped between
    storing and applying; cancelled, the rest stay for the next sweep."""
    total = 0
    while True:
        async with conn.transaction():
            rows = await conn.fetch(TAKE_LEFT_BEHIND, age_seconds, batch)
            await _record(conn, _early(rows))
        total += len(rows)
        if len(rows) < batch:
            return total
