"""Broadcasts of a team: drafts, and the moves of the state table the API makes.

Every move is one conditional statement (``UPDATE ... WHERE status = ...
RETURNING``), so two requests racing on one broadcast cannot both move it:
the loser finds no row, and :func:`_refusal` tells it why (no such
broadcast, or the state it is in now). Every write bumps ``revision``.

The fanout (queued → sent or failed, the counts) is in
``tidings.storage.broadcasts_fanout``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from tidings.storage.connection import Row
from tidings.storage.db import Connection

# Every process LISTENs here; the payload is the id of a broadcast with fanout to do.
DUE_CHANNEL = "tidings_broadcasts_due"

STATUSES = ("draft", "scheduled", "queued", "sent", "failed", "canceled")

COLUMNS = """
id, team_id, name, status, segment_id, topic_id, from_email, from_name, reply_to_email,
subject, preview_text, html, text, variable_bindings::text AS variable_bindings, scheduled_at,
queued_at, sent_at, canceled_at, failure_reason, audience_count, eligible_count,
suppressed_count, queued_count, failed_count, revision, created_at, updated_at
"""

# The columns a draft's content is written to, in order, from $3.
CONTENT = (
    "name", "segment_id", "topic_id", "from_email", "from_name", "reply_to_email", "subject",
    "preview_text", "html", "text", "variable_bindings",
)

INSERT = f"""
INSERT INTO broadcasts (team_id, name, segment_id, topic_id, from_email, from_name,
                        reply_to_email, subject, preview_text, html, text, variable_bindings)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12::jsonb)
RETURNING {COLUMNS}
"""

SELECT = f"SELECT {COLUMNS} FROM broadcasts WHERE team_id = $1 AND id = $2"

SELECT_PAGE = f"""
SELECT {COLUMNS} FROM broadcasts
WHERE team_id = $1 AND ($2::text IS NULL OR status = $2)
ORDER BY created_at DESC, id DESC
LIMIT $3 OFFSET $4
"""

STATE = "SELECT status, revision FROM broadcasts WHERE team_id = $1 AND id = $2"
STATE_ONLY = "SELECT status FROM broadcasts WHERE team_id = $1 AND id = $2"

# $3 the revision the caller read (or gave); then the content columns.
UPDATE_DRAFT = f"""
UPDATE broadcasts SET name = $4, segment_id = $5, topic_id = $6, from_email = $7,
    from_name = $8, reply_to_email = $9, subject = $10, preview_text = $11, html = $12,
    text = $13, variable_bindings = $14::jsonb, revision = revision + 1,
    updated_at = greatest(updated_at, now())
WHERE team_id = $1 AND id = $2 AND status = 'draft' AND revision = $3
RETURNING {COLUMNS}
"""

DELETE_DRAFT = """
DELETE FROM broadcasts WHERE team_id = $1 AND id = $2 AND status = 'draft' RETURNING id
"""

# $3 scheduled_at (NULL: now). The fanout dispatchers of every process are
# told on commit; a scheduled broadcast's actor then waits for its time.
SEND = f"""
WITH sent AS (
    UPDATE broadcasts SET
        status = CASE WHEN $3::timestamptz IS NULL THEN 'queued' ELSE 'scheduled' END,
        scheduled_at = $3, queued_at = CASE WHEN $3::timestamptz IS NULL THEN now() END,
        revision = revision + 1, updated_at = greatest(updated_at, now())
    WHERE team_id = $1 AND id = $2 AND status = 'draft'
    RETURNING {COLUMNS}
)
SELECT sent.*, pg_notify('{DUE_CHANNEL}', sent.id::text) FROM sent
"""

# Scheduled: back to draft, scheduling removed. Queued: canceled; the fanout
# sees it at its next batch and stops. Run after FANOUT_EXCLUSIVE: the
# batches that were in flight have committed, so the counts are final.
CANCEL = f"""
UPDATE broadcasts SET
    status = CASE status WHEN 'scheduled' THEN 'draft' ELSE 'canceled' END,
    scheduled_at = CASE status WHEN 'scheduled' THEN NULL ELSE scheduled_at END,
    canceled_at = CASE status WHEN 'queued' THEN greatest(updated_at, now()) ELSE canceled_at END,
    lease_owner = NULL, leased_until = NULL,
    revision = revision + 1, updated_at = greatest(updated_at, now())
WHERE team_id = $1 AND id = $2 AND status IN ('scheduled', 'queued')
RETURNING {COLUMNS}
"""

# "fano" in ASCII: the class of the broadcasts' fanout locks (two-key
# advisory locks); the second key is the broadcast's. Each batch of a fanout
# holds it shared for its transaction; a cancel takes it alone, so it waits
# for the batches in flight (a batch at most) and batches that begin later
# wait for the cancel, then find the broadcast canceled and write nothing.
FANOUT_LOCK = 0x66616E6F
FANOUT_SHARED = f"SELECT pg_advisory_xact_lock_shared({FANOUT_LOCK}, hashtext($1::uuid::text))"
FANOUT_EXCLUSIVE = f"SELECT pg_advisory_xact_lock({FANOUT_LOCK}, hashtext($1::uuid::text))"

SEGMENT_EXISTS = "SELECT EXISTS (SELECT 1 FROM segments WHERE team_id = $1 AND id = $2)"
TOPIC_EXISTS = "SELECT EXISTS (SELECT 1 FROM topics WHERE team_id = $1 AND id = $2)"


@dataclass(frozen=True)
class Broadcast:
    id: UUID
    team_id: UUID
    name: str
    status: str
    segment_id: UUID
    topic_id: UUID | None
    from_email: str
    from_name: str | None
    reply_to_email: str | None
    subject: str
    preview_text: str | None
    html: str
    text: str | None
    variable_bindings: dict[str, Any]
    scheduled_at: datetime | None
    queued_at: datetime | None
    sent_at: datetime | None
    canceled_at: datetime | None
    failure_reason: str | None
    audience_count: int
    eligible_count: int
    suppressed_count: int
    queued_count: int
    failed_count: int
    revision: int
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: Any) -> Broadcast:
        fields = dict(row)
        fields["variable_bindings"] = json.loads(fields["variable_bindings"])
        return cls(**fields)


@dataclass(frozen=True)
class Content:
    """What a draft says: every field a client writes."""

    name: str
    segment_id: UUID
    topic_id: UUID | None
    from_email: str
    from_name: str | None
    reply_to_email: str | None
    subject: str
    preview_text: str | None
    html: str
    text: str | None
    variable_bindings: dict[str, Any]

    def args(self) -> list[Any]:
        values = [getattr(self, name) for name in CONTENT]
        values[-1] = json.dumps(self.variable_bindings)
        return values


class WrongState(Exception):
    """The broadcast exists but is in a state that does not allow the move."""

    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


class StaleRevision(Exception):
    """The caller's revision is not the broadcast's current one."""

    def __init__(self, given: int, current: int) -> None:
        super().__init__(given, current)
        self.given = given
        self.current = current


async def create(conn: Connection, team_id: UUID, content: Content) -> Broadcast:
    row = await conn.fetchrow(INSERT, team_id, *content.args())
    return Broadcast.from_row(row)


async def get(
    conn: Connection, team_id: UUID, broadcast_id: UUID, *, lock: bool = False
) -> Broadcast | None:
    """``lock``: and hold the row (FOR NO KEY UPDATE) until the transaction ends."""
    row = await conn.fetchrow(SELECT + (" FOR NO KEY UPDATE" if lock else ""), team_id,
                              broadcast_id)
    return None if row is None else Broadcast.from_row(row)


async def list_page(
    conn: Connection, team_id: UUID, status: str | None, limit: int, offset: int
) -> list[Broadcast]:
    """Newest first."""
    rows = await conn.fetch(SELECT_PAGE, team_id, status, limit, offset)
    return [Broadcast.from_row(row) for row in rows]


# A move whose statement found the broadcast in another state is tried again
# when, read after it, the state allows the move: a concurrent move committed
# in between (a send while this cancel ran), and the move is made on what is
# there now rather than refused with a state that would have allowed it.
MOVE_ATTEMPTS = 3


async def _move(
    conn: Connection, statement: str, team_id: UUID, broadcast_id: UUID, *args: object,
    allowed: tuple[str, ...],
) -> Row | None:
    """Run a conditional move: its row, or None (no such broadcast). Raises WrongState."""
    status = None
    for _ in range(MOVE_ATTEMPTS):
        row = await conn.fetchrow(statement, team_id, broadcast_id, *args)
        if row is not None:
            return row
        status = await conn.fetchval(STATE_ONLY, team_id, broadcast_id)
        if status is None:
            return None
        if status not in allowed:
            break
    raise WrongState(str(status))


async def update_draft(
    conn: Connection, team_id: UUID, broadcast_id: UUID, revision: int, content: Content
) -> Broadcast | None:
    """Write a draft's content if it is still a draft at ``revision``; None: no
    such broadcast. Raises WrongState or StaleRevision."""
    row = await conn.fetchrow(UPDATE_DRAFT, team_id, broadcast_id, revision, *content.args())
    if row is not None:
        return Broadcast.from_row(row)
    state = await conn.fetchrow(STATE, team_id, broadcast_id)
    if state is None:
        return None
    if state["status"] != "draft":
        raise WrongState(state["status"])
    raise StaleRevision(revision, state["revision"])


async def delete_draft(conn: Connection, team_id: UUID, broadcast_id: UUID) -> bool:
    """Delete a draft; False: no such broadcast. Raises WrongState."""
    row = await _move(conn, DELETE_DRAFT, team_id, broadcast_id, allowed=("draft",))
    return row is not None


async def send(
    conn: Connection, team_id: UUID, broadcast_id: UUID, scheduled_at: datetime | None
) -> Broadcast | None:
    """Draft → queued (no ``scheduled_at``) or scheduled; None: no such
    broadcast. Raises WrongState."""
    row = await _move(conn, SEND, team_id, broadcast_id, scheduled_at, allowed=("draft",))
    if row is None:
        return None
    return Broadcast.from_row({k: v for k, v in dict(row).items() if k != "pg_notify"})


async def cancel(conn: Connection, team_id: UUID, broadcast_id: UUID) -> Broadcast | None:
    """Scheduled → draft, queued → canceled; None: no such broadcast. Raises WrongState.
    Waits for the fanout's batches in flight: what it returns is final."""
    async with conn.transaction():
        await conn.execute(FANOUT_EXCLUSIVE, broadcast_id)
        row = await _move(conn, CANCEL, team_id, broadcast_id, allowed=("scheduled", "queued"))
    return None if row is None else Broadcast.from_row(row)


async def segment_exists(conn: Connection, team_id: UUID, segment_id: UUID) -> bool:
    return bool(await conn.fetchval(SEGMENT_EXISTS, team_id, segment_id))


async def topic_exists(conn: Connection, team_id: UUID, topic_id: UUID) -> bool:
    return bool(await conn.fetchval(TOPIC_EXISTS, team_id, topic_id))
