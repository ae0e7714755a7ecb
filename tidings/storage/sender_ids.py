"""Sender IDs of a team: who its text messages may say they are from.

A value is unique per team. Only an ``approved`` sender ID sends
(``tidings.storage.sms`` checks it when a message is accepted and again
when it is sent).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import asyncpg

from tidings.providers.sms import SenderIdDecision, SenderIdType
from tidings.storage.connection import Connection, Row, returned
from tidings.storage.errors import Duplicate

# The unique index that gives a long or short code to one team.
NUMBER_OWNER = "sender_ids_number_owner"

COLUMNS = "id, team_id, value, type, status, countries, created_at, updated_at"

INSERT = f"""
INSERT INTO sender_ids (team_id, value, type, status, countries)
VALUES ($1, $2, $3, $4, $5)
RETURNING {COLUMNS}
"""

SELECT_ONE = f"SELECT {COLUMNS} FROM sender_ids WHERE team_id = $1 AND id = $2"

SELECT_PAGE = f"""
SELECT {COLUMNS} FROM sender_ids
WHERE team_id = $1 AND ($2::text IS NULL OR status = $2)
ORDER BY created_at DESC, id DESC
LIMIT $3 OFFSET $4
"""

DELETE = "DELETE FROM sender_ids WHERE team_id = $1 AND id = $2 RETURNING id"

# The teams that own an approved sender ID of this value (an inbound reply
# names the number it was sent to).
# Only a number takes replies: an alphanumeric name, which several teams may
# hold, owns none (a reply "to" one is no team's to act on).
TEAMS_OF_VALUE = """
SELECT DISTINCT team_id FROM sender_ids
WHERE value = ANY($1::text[]) AND status IN ('approved', 'pending') AND type <> 'alphanumeric'
"""

# Pending sender IDs of every team not asked about for $1 seconds, oldest
# first; each is marked asked now, so that another process looking at the
# same moment takes others (SKIP LOCKED) and none is asked twice at once.
TAKE_DUE_REVIEWS = f"""
WITH due AS (
    SELECT id FROM sender_ids
    WHERE status = 'pending' AND reviewed_at <= now() - make_interval(secs => $1)
    ORDER BY reviewed_at LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE sender_ids s SET reviewed_at = now()
FROM due WHERE s.id = due.id
RETURNING {", ".join("s." + name for name in COLUMNS.split(", "))}
"""

# The decisions ($1 ids, $2 statuses) on sender IDs still pending; the ones
# that changed.
RECORD_REVIEWS = f"""
UPDATE sender_ids s SET status = d.status, reviewed_at = now(), updated_at = now()
FROM unnest($1::uuid[], $2::text[]) AS d(id, status)
WHERE s.id = d.id AND s.status = 'pending' AND d.status <> 'pending'
RETURNING {", ".join("s." + name for name in COLUMNS.split(", "))}
"""


@dataclass(frozen=True)
class SenderId:
    id: UUID
    team_id: UUID
    value: str
    type: SenderIdType
    status: SenderIdDecision
    countries: list[str]
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: Row) -> SenderId:
        return cls(**{name: row[name] for name in COLUMNS.split(", ")})


async def create_sender_id(
    conn: Connection,
    team_id: UUID,
    value: str,
    type: SenderIdType,
    status: SenderIdDecision,
    countries: list[str],
) -> SenderId:
    """Store a sender ID. Raises Duplicate when the team has this value
    already, or when it is a number (long or short code) of another team."""
    try:
        row = await conn.fetchrow(INSERT, team_id, value, type, status, countries)
    except asyncpg.UniqueViolationError as error:
        if error.constraint_name == NUMBER_OWNER:
            raise Duplicate("value", f"{value!r} is registered by another team: a long code "
                                     "or short code belongs to one team") from None
        raise Duplicate("value", f"{value!r} is a sender ID of the team already") from None
    return SenderId.from_row(returned(row))


async def get_sender_id(conn: Connection, team_id: UUID, sender_id: UUID) -> SenderId | None:
    row = await conn.fetchrow(SELECT_ONE, team_id, sender_id)
    return None if row is None else SenderId.from_row(row)


async def list_sender_ids(
    conn: Connection, team_id: UUID, status: str | None, limit: int, offset: int
) -> list[SenderId]:
    """Newest first."""
    rows = await conn.fetch(SELECT_PAGE, team_id, status, limit, offset)
    return [SenderId.from_row(row) for row in rows]


async def delete_sender_id(conn: Connection, team_id: UUID, sender_id: UUID) -> bool:
    return await conn.fetchval(DELETE, team_id, sender_id) is not None


async def teams_of_sender(conn: Connection, spellings: Sequence[str]) -> list[UUID]:
    """The teams with a long or short code spelled one of ``spellings``,
    approved or still pending (it belongs to that team alone either way,
    and a reply to it came to the team's number)."""
    return [row["team_id"] for row in await conn.fetch(TEAMS_OF_VALUE, list(spellings))]


async def take_due_reviews(conn: Connection, interval_seconds: float, limit: int) -> list[SenderId]:
    """Pending sender IDs, of every team, last asked about more than
    ``interval_seconds`` ago; marked asked now."""
    rows = await conn.fetch(TAKE_DUE_REVIEWS, interval_seconds, limit)
    return [SenderId.from_row(row) for row in rows]


async def record_reviews(
    conn: Connection, decisions: Sequence[tuple[UUID, SenderIdDecision]]
) -> list[SenderId]:
    """Store the provider's decisions on pending sender IDs; the ones that
    changed (a sender ID deleted or decided meanwhile is left out)."""
    rows = await conn.fetch(
        RECORD_REVIEWS, [id for id, _ in decisions], [status for _, status in decisions]
    )
    return [SenderId.from_row(row) for row in rows]
