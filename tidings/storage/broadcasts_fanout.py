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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from tidings.config import QuotaDefaults
from tidings.storage.broadcasts import COLUMNS, DUE_CHANNEL, Broadcast
from tidings.storage.connection import Connection
from tidings.storage.emails import DUE_CHANNEL as EMAILS_DUE
from tidings.storage.events import FANOUT
from tidings.storage.leases import lease_sql
from tidings.storage.quotas import claim as claim_quota

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
                      updated_at = now()
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
        revision = t.revision + 1, updated_at = now()
    FROM b, found WHERE t.id = b.id AND found.segment AND found.topic
    RETURNING t.eligible_count
)
SELECT (SELECT count(*) FROM b) AS held, found.segment, found.topic,
       (SELECT eligible_count FROM counted) AS eligible
FROM found
"""

# The html, subject and text of one recipient: its pieces joined with the
# values of the keys between them, from the jsonb ``vals``.
_ESCAPED = (
    "replace(replace(replace(replace(replace(v, '&', '&amp;'), '<', '&lt;'), '>', '&gt;'),"
    " '\"', '&quot;'), '''', '&#x27;')"
)


def _joined(pieces: str, keys: str, value: str) -> str:
    return f"""(SELECT string_agg(p.piece || coalesce({value}, ''), '' ORDER BY p.n)
       FROM unnest({pieces}::text[], {keys}::text[]) WITH ORDINALITY AS p(piece, key, n),
            LATERAL (SELECT r.vals ->> p.key AS v) val)"""


_SUBJECT = _joined("$3", "$4", "regexp_replace(val.v, E'\\r\\n|\\n|\\r', ' ', 'g')")
_HTML = _joined("$5", "$6", _ESCAPED.replace("(v,", "(val.v,"))
_TEXT = _joined("$7", "$8", "val.v")

# $1 broadcast, $2 lease owner; the plan: $3/$4 subject pieces/keys, $5/$6
# html, $7/$8 text (pieces NULL: no text), $9 defaults (jsonb); the email:
# $10 from (as shown), $11 from (bare), $12 reply-to (array), $13 domain,
# $14 provider; $15/$16 the HMAC inner and outer keys, $17 the unsubscribe
# link up to the token.
#
# The broadcast is only share-locked (FOR KEY SHARE), so batches of several
# connections run at once and a cancel does not wait for them; the chunk is
# claimed with SKIP LOCKED, so each goes to one batch. An email's id is made
# from its broadcast and contact: the primary key is the guard that no
# contact ever gets two emails of one broadcast.
QUEUE_BATCH = f"""
WITH b AS (
    SELECT id, team_id, topic_id FROM broadcasts
    WHERE id = $1 AND status = 'queued' AND lease_owner = $2 AND snapshot_at IS NOT NULL
    FOR KEY SHARE
), chunk AS (
    SELECT k.chunk, k.contact_ids FROM broadcast_chunks k
    WHERE k.broadcast_id = $1 AND NOT k.done AND EXISTS (SELECT 1 FROM b)
    ORDER BY k.chunk LIMIT 1
    FOR UPDATE OF k SKIP LOCKED
), next AS (
    SELECT u.contact_id, b.team_id, b.topic_id
    FROM chunk CROSS JOIN b CROSS JOIN unnest(chunk.contact_ids) AS u(contact_id)
), signed AS (
    SELECT n.*, '\\x01'::bytea || uuid_send(n.team_id) || uuid_send(n.contact_id)
                || uuid_send(coalesce(n.topic_id, '00000000-0000-0000-0000-000000000000'))
                AS message
    FROM next n
), r AS MATERIALIZED (
    SELECT s.contact_id, s.team_id, c.email, md5($1::text || s.contact_id::text)::uuid AS email_id,
           u.url,
           $9::jsonb || coalesce(jsonb_strip_nulls(c.properties), '{{}}'::jsonb)
           || jsonb_strip_nulls(jsonb_build_object(
                  'email', c.email, 'first_name', c.first_name, 'last_name', c.last_name))
           || jsonb_build_object('unsubscribe_url', u.url) AS vals
    FROM signed s
    -- One primary-key lookup per recipient (a deleted contact: no row, the email fails).
    LEFT JOIN LATERAL (
        SELECT * FROM contacts WHERE id = s.contact_id AND team_id = s.team_id
    ) c ON true
    CROSS JOIN LATERAL (
        SELECT $17 || translate(encode(s.message || substring(
                   sha256($16::bytea || sha256($15::bytea || s.message)) FROM 1 FOR 16),
                   'base64'), E'+/=\\n', '-_') AS url
    ) u
), rendered AS MATERIALIZED (
    SELECT r.*,
           {_SUBJECT} AS subject,
           {_HTML} AS html,
           CASE WHEN $7::text[] IS NOT NULL THEN {_TEXT} END AS text,
           r.email IS NOT NULL AND NOT EXISTS (
               SELECT 1 FROM unnest($4::text[] || $6::text[] || $8::text[]) k
               WHERE r.vals ->> k IS NULL) AS complete
    FROM r
), inserted AS (
    INSERT INTO emails (id, team_id, from_address, from_email, to_addresses, reply_to,
                        to_lookup, send_to, subject, html, text, headers, tags, status,
                        domain, smtp_message_id, provider, next_attempt_at, status_at,
                        broadcast_id, contact_id)
    SELECT x.email_id, x.team_id, $10, $11, ARRAY[x.email], $12::text[], ARRAY[lower(x.email)],
           ARRAY[x.email], x.subject, x.html, x.text,
           jsonb_build_object('List-Unsubscribe', '<' || x.url || '>',
                              'List-Unsubscribe-Post', 'List-Unsubscribe=One-Click'),
           jsonb_build_array(jsonb_build_object('name', 'broadcast_id', 'value', $1::text)),
           'queued', $13, '<' || x.email_id || '@' || $13 || '>', $14, now(), now(),
           $1, x.contact_id
    FROM rendered x WHERE x.complete
    ON CONFLICT (id) DO NOTHING
    RETURNING id, team_id, to_addresses, subject, contact_id
), queued AS MATERIALIZED (
    SELECT i.*, gen_random_uuid() AS event_id FROM inserted i
), email_event AS (
    INSERT INTO email_events (id, email_id, team_id, type, recipient, provider)
    SELECT event_id, id, team_id, 'queued', to_addresses[1], $14 FROM queued
), event AS (
    INSERT INTO events (id, team_id, type, channel, message_id, recipient, data)
    SELECT q.event_id, q.team_id, 'message.queued', 'email', q.id, q.to_addresses[1],
           jsonb_build_object('email_id', q.id, 'from', $10::text, 'to', to_jsonb(q.to_addresses),
                              'subject', q.subject, 'broadcast_id', $1::uuid)
    FROM queued q
    RETURNING id, team_id, type
), {FANOUT}, finished AS (
    UPDATE broadcast_chunks k SET done = true FROM chunk
    WHERE k.broadcast_id = $1 AND k.chunk = chunk.chunk
)
SELECT (SELECT count(*) FROM b) AS held,
       (SELECT count(*) FROM rendered) AS handled,
       (SELECT count(*) FROM queued) AS queued,
       (SELECT count(*) FROM rendered WHERE NOT complete) AS failed,
       (SELECT woken FROM woken) AS woken,
       (SELECT count(pg_notify('{EMAILS_DUE}', team_id::text))
        FROM (SELECT team_id FROM queued LIMIT 1) one) AS senders
"""

# What a batch did, on the broadcast: its own statement, the last of the
# batch's transaction, so that the row lock it takes is held only until the
# commit that follows. Whatever the status: the emails are queued. The lease
# is extended only when it is still the caller's.
# $1 broadcast, $2 handled, $3 queued, $4 failed, $5 lease owner, $6 lease seconds.
COUNT_BATCH = """
UPDATE broadcasts SET
    fanout_cursor = fanout_cursor + $2,
    queued_count = queued_count + $3,
    failed_count = failed_count + $4,
    leased_until = CASE WHEN lease_owner = $5 THEN now() + $6 * interval '1 second'
                        ELSE leased_until END,
    revision = revision + 1, updated_at = now()
WHERE id = $1
"""


def _ended(status: str, where: str, extra: str) -> str:
    return f"""
WITH ended AS (
    UPDATE broadcasts SET status = '{status}', {extra} lease_owner = NULL, leased_until = NULL,
                          revision = revision + 1, updated_at = now()
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


@dataclass(frozen=True)
class Queued:
    """What one batch did: ``held`` False means the broadcast is not ours to
    fan out any more (canceled, or its lease was taken)."""

    held: bool
    handled: int
    queued: int
    failed: int


def _broadcast(row: Any) -> Broadcast:
    names = [n.strip().split(" AS ")[-1] for n in COLUMNS.replace("\n", " ").split(",")]
    return Broadcast.from_row({name: row[name] for name in names})


async def claim(
    conn: Connection, broadcast_id: UUID, owner: UUID, seconds: float
) -> Claimed | None:
    rows = await conn.fetch(LEASES.claim, broadcast_id, owner, seconds, 1)
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


async def _queue(conn: Connection, args: Sequence[Any], lease_seconds: float) -> Queued:
    row = await conn.fetchrow(QUEUE_BATCH, *args)
    assert row is not None
    done = Queued(bool(row["held"]), row["handled"], row["queued"], row["failed"])
    if done.handled:
        await conn.execute(COUNT_BATCH, args[0], done.handled, done.queued, done.failed,
                           args[1], lease_seconds)
    return done


async def queue_batch(
    conn: Connection, args: Sequence[Any], lease_seconds: float = 30.0
) -> Queued:
    """One chunk, in one transaction (``args``: see ``QUEUE_BATCH``); ``handled``
    0 with ``held``: no chunk left that another batch is not working on."""
    async with conn.transaction():
        return await _queue(conn, args, lease_seconds)


async def queue_counted(
    conn: Connection, args: Sequence[Any], lease_seconds: float, team_id: UUID,
    quotas: QuotaDefaults,
) -> Queued:
    """One chunk and the team's email quota for what it queued, in one
    transaction. Raises QuotaExceeded, leaving nothing of the batch."""
    async with conn.transaction():
        queued = await _queue(conn, args, lease_seconds)
        if queued.queued:
            await claim_quota(conn, team_id, "email", queued.queued, quotas)
    return queued


async def finish(conn: Connection, broadcast_id: UUID, owner: UUID) -> Broadcast | None:
    """Queued → sent with ``broadcast.sent``, if every recipient was handled."""
    row = await conn.fetchrow(FINISH, broadcast_id, owner)
    return None if row is None else _broadcast(row)


async def fail(conn: Connection, broadcast_id: UUID, reason: str) -> Broadcast | None:
    """Queued or scheduled → failed with ``broadcast.failed``; None if it was neither."""
    row = await conn.fetchrow(FAIL, broadcast_id, reason)
    return None if row is None else _broadcast(row)
