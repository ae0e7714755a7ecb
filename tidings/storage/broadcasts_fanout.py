"""A broadcast's fanout in PostgreSQL: lease, snapshot, batches, the end.

A broadcast with fanout to do (``queued``, or ``scheduled`` and due) is a
leased row (``tidings.storage.leases``) owned by itself: one process at a
time works on it, and a process that dies hands it on when the lease ends.

1. ``promote``: a scheduled broadcast whose time has come becomes queued.
2. ``snapshot``: one statement resolves the segment's members once, counts
   ``audience_count``, ``suppressed_count`` (no email, unsubscribed, on the
   suppression list, opted out of the topic) and ``eligible_count``, and
   keeps the eligible ones; contacts that join the segment later are not.
   They are stored in chunks of one batch each (``broadcast_chunks``).
3. ``queue_batch``: one statement claims the next chunk not done (``FOR
   UPDATE SKIP LOCKED``: several connections work on one broadcast at
   once), renders each email (``broadcasts_render``; the unsubscribe token
   is signed in SQL, see ``tidings.unsubscribe``), inserts the emails queued
   for the send worker with their ``queued`` events and webhook events, and
   marks the chunk done; a second one moves the counts and extends the
   lease. It does nothing unless the broadcast is still queued and leased
   to the caller, so a cancel stops it at the next batch; an email's id is
   made from its broadcast and contact, so no contact is ever queued twice.
4. ``finish`` (queued → sent) and ``fail`` (→ failed), each with its
   webhook event in the same statement.

Every function takes a raw connection and may run inside ``Database.run``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from tidings.storage.broadcasts import COLUMNS, DUE_CHANNEL, Broadcast
from tidings.storage.connection import Connection
from tidings.storage.events import FANOUT
from tidings.storage.leases import claim_rows, lease_sql

LEASES = lease_sql(
    "broadcasts",
    owner="id",
    due="coalesce(t.scheduled_at, t.queued_at)",
    pending="t.status IN ('queued', 'scheduled')",
    claimed=f"SELECT {COLUMNS}, snapshot_at IS NOT NULL AS snapshotted FROM claimed",
)

__all__ = ["DUE_CHANNEL", "LEASES"]

PROMOTE = f"""
UPDATE broadcasts SET status = 'queued', queued_at = now(), revision = revision + 1,
                      updated_at = greatest(updated_at, now())
WHERE id = $1 AND status = 'scheduled' AND lease_owner = $2
RETURNING {COLUMNS}
"""

# $1 broadcast, $2 lease owner, $3 contacts per chunk. Missing segment or
# topic: nothing is written and the flags say which. Hash joins throughout:
# one pass over the segment, its contacts, the topic's subscriptions and the
# team's suppressions, whatever the audience's size.
SNAPSHOT = """
WITH b AS (
    SELECT * FROM broadcasts
    WHERE id = $1 AND status = 'queued' AND lease_owner = $2 AND snapshot_at IS NULL
    FOR UPDATE
), found AS (
    SELECT EXISTS (SELECT 1 FROM segments s JOIN b ON s.id = b.segment_id
                   AND s.team_id = b.team_id) AS segment,
           EXISTS (SELECT 1 FROM b WHERE b.topic_id IS NULL
                   OR EXISTS (SELECT 1 FROM topics t WHERE t.id = b.topic_id
                              AND t.team_id = b.team_id)) AS topic
), topic AS (
    SELECT t.id, t.default_subscription FROM topics t JOIN b ON t.id = b.topic_id
), members AS MATERIALIZED (
    SELECT c.id,
           c.email IS NULL
           OR c.unsubscribed
           OR sup.address IS NOT NULL
           OR (b.topic_id IS NOT NULL AND coalesce(ts.subscription, topic.default_subscription)
               IS DISTINCT FROM 'opt_in') AS blocked
    FROM b
    JOIN found ON found.segment AND found.topic
    JOIN segment_contacts sc ON sc.segment_id = b.segment_id
    JOIN contacts c ON c.id = sc.contact_id AND c.team_id = b.team_id
    LEFT JOIN topic ON true
    LEFT JOIN topic_subscriptions ts ON ts.topic_id = topic.id AND ts.contact_id = c.id
    -- (team_id, address) is unique: at most one row per contact.
    LEFT JOIN suppressions sup ON sup.team_id = c.team_id AND sup.address = lower(c.email)
), numbered AS (
    SELECT id, row_number() OVER (ORDER BY id) - 1 AS n FROM members WHERE NOT blocked
), chunks AS (
    INSERT INTO broadcast_chunks (broadcast_id, chunk, contact_ids)
    SELECT $1, n / $3, array_agg(id ORDER BY n) FROM numbered GROUP BY n / $3
    RETURNING cardinality(contact_ids) AS size
), counted AS (
    UPDATE broadcasts t SET
        snapshot_at = now(),
        audience_count = (SELECT count(*) FROM members),
        suppressed_count = (SELECT count(*) FROM members WHERE blocked),
        eligible_count = (SELECT coalesce(sum(size), 0) FROM chunks),
        revision = t.revision + 1, updated_at = greatest(t.updated_at, now())
    FROM b, found WHERE t.id = b.id AND found.segment AND found.topic
    RETURNING t.eligible_count
)
SELECT (SELECT count(*) FROM b) AS held, found.segment, found.topic,
       (SELECT eligible_count FROM counted) AS eligible
FROM found
"""

def _ended(status: str, where: str, extra: str) -> str:
    return f"""
WITH ended AS (
    UPDATE broadcasts SET status = '{status}', {extra} lease_owner = NULL, leased_until = NULL,
                          revision = revision + 1, updated_at = greatest(updated_at, now())
    WHERE id = $1 AND {where}
    RETURNING {COLUMNS}
), event AS (
    INSERT INTO events (team_id, type, data)
    SELECT team_id, 'broadcast.{status}', jsonb_build_object(
        'broadcast_id', id, 'name', name, 'status', status, 'segment_id', segment_id,
        'audience_count', audience_count, 'eligible_count', eligible_count,
        'suppressed_count', suppressed_count, 'queued_count', queued_count,
        'failed_count', failed_count, 'failure_reason', failure_reason)
    FROM ended
    RETURNING id, team_id, type
), {FANOUT}
SELECT ended.*, (SELECT woken FROM woken) AS woken FROM ended
"""


# $1 broadcast, $2 lease owner: every recipient handled.
FINISH = _ended(
    "sent", "status = 'queued' AND lease_owner = $2 AND snapshot_at IS NOT NULL "
    "AND NOT EXISTS (SELECT 1 FROM broadcast_chunks k WHERE k.broadcast_id = $1 AND NOT k.done)",
    "sent_at = now(),",
)

# $1 broadcast, $2 the reason. Whoever holds it: the fanout itself, or the
# supervisor that gave its actor up.
FAIL = _ended(
    "failed", "status IN ('queued', 'scheduled') AND $2::text IS NOT NULL",
    "failed_at = now(), failure_reason = $2,",
)

PROPERTY_FALLBACKS = """
SELECT key, fallback_value::text AS fallback FROM contact_properties
WHERE team_id = $1 AND fallback_value IS NOT NULL
"""


@dataclass(frozen=True)
class Claimed:
    broadcast: Broadcast
    snapshotted: bool


@dataclass(frozen=True)
class Snapshot:
    held: bool
    segment_found: bool
    topic_found: bool
    eligible: int


def _broadcast(row: Any) -> Broadcast:
    names = [n.strip().split(" AS ")[-1] for n in COLUMNS.replace("\n", " ").split(",")]
    return Broadcast.from_row({name: row[name] for name in names})


async def claim(
    conn: Connection, broadcast_id: UUID, owner: UUID, seconds: float
) -> Claimed | None:
    rows = await claim_rows(conn, LEASES.claim, broadcast_id, owner, seconds, 1)
    if not rows:
        return None
    return Claimed(_broadcast(rows[0]), rows[0]["snapshotted"])


async def seconds_to_next_due(conn: Connection, broadcast_id: UUID) -> float | None:
    value: float | None = await conn.fetchval(LEASES.seconds_to_next_due, broadcast_id)
    return value


async def due_broadcasts(conn: Connection, limit: int) -> list[UUID]:
    return [row["owner"] for row in await conn.fetch(LEASES.due_owners, limit)]


async def release(conn: Connection, broadcast_id: UUID, owner: UUID) -> None:
    await conn.execute(LEASES.release, [broadcast_id], owner)


async def promote(conn: Connection, broadcast_id: UUID, owner: UUID) -> Broadcast | None:
    row = await conn.fetchrow(PROMOTE, broadcast_id, owner)
    return None if row is None else Broadcast.from_row(row)


async def snapshot(
    conn: Connection, broadcast_id: UUID, owner: UUID, chunk_size: int
) -> Snapshot:
    """Resolve the audience once, in chunks of ``chunk_size`` contacts: the batches."""
    row = await conn.fetchrow(SNAPSHOT, broadcast_id, owner, chunk_size)
    assert row is not None
    return Snapshot(bool(row["held"]), row["segment"], row["topic"], row["eligible"] or 0)


async def property_fallbacks(conn: Connection, team_id: UUID) -> dict[str, Any]:
    rows = await conn.fetch(PROPERTY_FALLBACKS, team_id)
    return {row["key"]: json.loads(row["fallback"]) for row in rows}


async def finish(conn: Connection, broadcast_id: UUID, owner: UUID) -> Broadcast | None:
    """Queued → sent with ``broadcast.sent``, if every recipient was handled."""
    row = await conn.fetchrow(FINISH, broadcast_id, owner)
    return None if row is None else _broadcast(row)


async def fail(conn: Connection, broadcast_id: UUID, reason: str) -> Broadcast | None:
    """Queued or scheduled → failed with ``broadcast.failed``; None if it was neither."""
    row = await conn.fetchrow(FAIL, broadcast_id, reason)
    return None if row is None else _broadcast(row)
