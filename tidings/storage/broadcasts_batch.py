"""One batch of a broadcast's fanout: a chunk of its snapshot queued as emails.

A batch is one transaction on one connection:

1. the broadcast's fanout lock is taken shared (``FANOUT_SHARED``: a
   cancel takes it alone, so it waits for the batches in flight and the
   batches after it find the broadcast canceled); ``CLAIM_CHUNK`` takes
   the next chunk not done (``FOR UPDATE SKIP
   LOCKED``, so several connections work on one broadcast at once, each on
   its own chunk) and reads its recipients' contacts;
2. the batch's ``Renderer`` makes each email in Python (``broadcasts_render``)
   and signs its unsubscribe link;
3. ``QUEUE_EMAILS`` inserts the emails, queued for the send worker, with
   their ``queued`` email events and webhook events, and marks the chunk
   done (a chunk of large emails is made and inserted in groups that each
   fit ``Batch.budget``, the last marking it done); ``COUNT_BATCH`` then
   moves the broadcast's counts and extends the lease; the team's email
   quota is claimed last.

Nothing is written unless the broadcast is still queued and leased to the
caller. The broadcast row is only share-locked (``FOR KEY SHARE``) while a
batch works, so batches run side by side; it is updated in the last
statements, just before the commit. An email's id is made from its broadcast
and contact (``tidings.storage.events.name_id``, an RFC 4122 version 3
UUID): the primary key of emails is the guard that no
contact ever gets two emails of one broadcast.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast
from uuid import UUID

from tidings.config import QuotaDefaults
from tidings.storage.broadcasts import FANOUT_SHARED
from tidings.storage.broadcasts_render import Rendered, Renderer
from tidings.storage.connection import Connection
from tidings.storage.emails import DUE_CHANNEL as EMAILS_DUE
from tidings.storage.events import FANOUT, name_id
from tidings.storage.quotas import claim as claim_quota
from tidings.storage.topics import not_opted_in

_HELD = """
SELECT id, team_id, topic_id FROM broadcasts
WHERE id = $1 AND status = 'queued' AND lease_owner = $2 AND snapshot_at IS NOT NULL
FOR KEY SHARE
"""

# $1 broadcast, $2 lease owner, $3 the keys read from contact properties, $4
# the sending domain. No chunk while the domain is not a verified one of the
# team (``sending`` 0): deleted (or no longer verified) during the fanout.
# The chunk holds it (FOR KEY SHARE) until it commits, so a delete waits for
# the chunk in flight and the next one sees it.
# One row per recipient of the chunk, in the order ``Renderer.render``
# reads; a single row with no chunk when none is left (or the broadcast is
# not held). ``blocked``: the contact has, since the snapshot, unsubscribed,
# opted out of the topic (or the topic is gone), lost its email or had it
# suppressed; the snapshot's own test, made again when its email is made.
# ``properties`` are JSON text, not ``->>``'s: the renderer writes a number
# as templates do (``format_value``), which needs to know it is one.
CLAIM_CHUNK = f"""
WITH b AS ({_HELD}), d AS (
    SELECT 1 FROM domains
    WHERE team_id = (SELECT team_id FROM b) AND name = $4 AND status = 'verified'
    FOR KEY SHARE
), chunk AS (
    SELECT k.chunk, k.contact_ids FROM broadcast_chunks k
    WHERE k.broadcast_id = $1 AND NOT k.done AND EXISTS (SELECT 1 FROM d)
    ORDER BY k.chunk LIMIT 1
    FOR UPDATE OF k SKIP LOCKED
)
SELECT u.contact_id, c.email, c.first_name, c.last_name,
       CASE WHEN cardinality($3::text[]) > 0 THEN
           ARRAY(SELECT (c.properties -> p.key)::text
                 FROM unnest($3::text[]) WITH ORDINALITY AS p(key, n) ORDER BY p.n)
       END AS properties,
       (SELECT count(*) FROM b) AS held, (SELECT count(*) FROM d) AS sending, chunk.chunk,
       c.id IS NOT NULL AND (
           c.email IS NULL
           OR c.unsubscribed
           OR EXISTS (SELECT 1 FROM suppressions sup
                      WHERE sup.team_id = c.team_id AND sup.address = lower(c.email))
           OR ((SELECT topic_id FROM b) IS NOT NULL
               AND {not_opted_in("(SELECT topic_id FROM b)", "c.id")})
       ) AS blocked
FROM (SELECT 1) one
LEFT JOIN chunk ON true
LEFT JOIN LATERAL unnest(chunk.contact_ids) AS u(contact_id) ON true
-- A contact deleted after the snapshot: no row, its email fails.
LEFT JOIN contacts c ON c.id = u.contact_id AND c.team_id = (SELECT team_id FROM b)
"""

# $1 broadcast, $2 lease owner, $3 the chunk; the emails: $4 contacts, $5
# addresses, $6 subjects, $7 htmls, $8 texts, $9 unsubscribe links; $10 from
# (as shown), $11 from (bare), $12 reply-to (array), $13 domain, $14 provider;
# $15 whether these are the chunk's last emails (it is then marked done).
QUEUE_EMAILS = f"""
WITH b AS ({_HELD}), inserted AS (
    INSERT INTO emails (id, team_id, from_address, from_email, to_addresses, reply_to,
                        to_lookup, send_to, subject, html, text, headers, tags, status,
                        domain, smtp_message_id, provider, next_attempt_at, status_at,
                        broadcast_id, contact_id)
    SELECT x.email_id, b.team_id, $10, $11, ARRAY[x.email], $12::text[], ARRAY[lower(x.email)],
           ARRAY[x.email], x.subject, x.html, x.text,
           jsonb_build_object('List-Unsubscribe', '<' || x.link || '>',
                              'List-Unsubscribe-Post', 'List-Unsubscribe=One-Click'),
           jsonb_build_array(jsonb_build_object('name', 'broadcast_id', 'value', $1::text)),
           'queued', $13, '<' || x.email_id || '@' || $13 || '>', $14, now(), now(),
           $1, x.contact_id
    FROM b, (SELECT {name_id("$1::text || i.contact_id::text")} AS email_id, i.*
             FROM unnest($4::uuid[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[])
                  AS i(contact_id, email, subject, html, text, link)) x
    ON CONFLICT (id) DO NOTHING
    RETURNING id, team_id, to_addresses, subject
), queued AS MATERIALIZED (
    SELECT i.*, {name_id("i.id::text || ':queued'")} AS event_id FROM inserted i
), email_event AS (
    INSERT INTO email_events (id, email_id, team_id, type, recipient, provider)
    SELECT event_id, id, team_id, 'queued', to_addresses[1], $14 FROM queued
), event AS (
    INSERT INTO events (id, team_id, type, channel, message_id, recipient, data)
    SELECT q.event_id, q.team_id, 'message.queued', 'email', q.id, q.to_addresses[1],
           jsonb_build_object('email_id', q.id, 'from', $10::text, 'to', to_jsonb(q.to_addresses),
                              'subject', q.subject, 'broadcast_id', $1::uuid,
                              'provider', $14::text, 'code', NULL, 'message', NULL)
    FROM queued q
    RETURNING id, team_id, type
), {FANOUT}, finished AS (
    UPDATE broadcast_chunks k SET done = true
    WHERE k.broadcast_id = $1 AND k.chunk = $3 AND $15::boolean AND EXISTS (SELECT 1 FROM b)
)
SELECT (SELECT count(*) FROM b) AS held,
       (SELECT count(*) FROM queued) AS queued,
       (SELECT woken FROM woken) AS woken,
       (SELECT count(pg_notify('{EMAILS_DUE}', team_id::text))
        FROM (SELECT team_id FROM queued LIMIT 1) one) AS senders
"""

# What a batch did, on the broadcast, whatever its status now (the emails
# are queued); the lease is extended only while it is still the caller's.
# Contacts blocked since the snapshot move from eligible to suppressed.
# $1 broadcast, $2 handled, $3 queued, $4 failed, $5 lease owner, $6 lease
# seconds, $7 blocked.
COUNT_BATCH = """
UPDATE broadcasts SET
    fanout_cursor = fanout_cursor + $2,
    queued_count = queued_count + $3,
    failed_count = failed_count + $4,
    eligible_count = eligible_count - $7,
    suppressed_count = suppressed_count + $7,
    leased_until = CASE WHEN lease_owner = $5 THEN now() + $6 * interval '1 second'
                        ELSE leased_until END,
    revision = revision + 1, updated_at = greatest(updated_at, now())
WHERE id = $1
"""


@dataclass(frozen=True)
class Batch:
    """What every batch of one broadcast's fanout needs."""

    broadcast_id: UUID
    owner: UUID  # the lease owner: this process
    team_id: UUID
    renderer: Renderer
    sender: str  # from, as shown
    from_email: str
    reply_to: list[str]
    domain: str
    provider: str
    lease_seconds: float
    # The most of a chunk's emails made at once, in bytes (about): a chunk
    # of large emails is queued in several statements of one transaction.
    budget: int = 32 * 1024 * 1024


# The emails made first, to learn how large the chunk's emails are.
PROBE = 8


class _Lost(Exception):
    """The broadcast was not the batch's any more after some of its chunk's
    emails were written: the transaction is rolled back."""


@dataclass(frozen=True)
class Queued:
    """What one batch did: ``held`` False means the broadcast is not ours to
    fan out any more (canceled, or its lease was taken); ``handled`` 0 with
    ``held``: no chunk left that another batch is not working on."""

    held: bool
    handled: int
    queued: int
    failed: int
    blocked: int = 0  # eligible at the snapshot, not any more: suppressed
    # The sending domain is not a verified one of the team any more: nothing queued.
    domain_gone: bool = False


async def claim_chunk(conn: Connection, batch: Batch) -> list[Any] | Queued:
    """The first half of a batch, in the caller's transaction: the fanout's
    lock, shared, then the next chunk's rows (for ``queue_chunk``); or what
    the batch did when there is nothing to queue."""
    await conn.execute(FANOUT_SHARED, batch.broadcast_id)
    rows = await conn.fetch(CLAIM_CHUNK, batch.broadcast_id, batch.owner,
                            batch.renderer.property_keys, batch.domain)
    held, chunk = bool(rows[0]["held"]), rows[0]["chunk"]
    if held and not rows[0]["sending"]:
        return Queued(True, 0, 0, 0, domain_gone=True)
    if not held or chunk is None:
        return Queued(held, 0, 0, 0)
    return list(rows)


def _size(made: Rendered) -> int:
    """About the bytes a group of emails holds (its characters)."""
    parts = (made.htmls, made.subjects, made.texts)
    return sum(len(part) for column in parts for part in column if part)


async def queue_chunk(conn: Connection, batch: Batch, rows: list[Any]) -> Queued:
    """The second half: the chunk's emails made and queued, the counts moved.
    The emails are made ``PROBE`` first, then as many at a time as
    ``batch.budget`` holds at the size seen; what is made is queued once it
    reaches the budget (a chunk of common emails: once, at its end), so a
    chunk of large emails never sits whole in memory."""
    renderer = batch.renderer
    recipients = [row for row in rows if not row["blocked"]]
    queued = failed = start = 0
    step = min(PROBE, len(recipients))
    made, size, written = Rendered(), 0, False
    while True:
        # An asyncpg Record iterates over its values, in the statement's order.
        group = renderer.render(cast(list[Sequence[Any]], recipients[start:start + step]))
        start += step
        made.extend(group)
        size += _size(group)
        last = start >= len(recipients)
        if last or size >= batch.budget:
            texts = made.texts if renderer.has_text else None  # NULL: every text NULL
            row = await conn.fetchrow(
                QUEUE_EMAILS, batch.broadcast_id, batch.owner, rows[0]["chunk"],
                made.contact_ids, made.emails, made.subjects, made.htmls, texts, made.links,
                batch.sender, batch.from_email, batch.reply_to, batch.domain, batch.provider,
                last,
            )
            assert row is not None
            if not row["held"]:
                if written:  # what the batch wrote before is rolled back with it
                    raise _Lost
                return Queued(False, 0, 0, 0)
            queued, failed, written = queued + row["queued"], failed + made.failed, True
            made, size = Rendered(), 0
        if last:
            break
        if group.htmls:
            step = max(1, min(len(recipients) - start,
                              batch.budget * len(group.htmls) // max(_size(group), 1)))
    done = Queued(True, len(rows), queued, failed, len(rows) - len(recipients))
    await conn.execute(COUNT_BATCH, batch.broadcast_id, done.handled, done.queued, done.failed,
                       batch.owner, batch.lease_seconds, done.blocked)
    return done


async def _queue(conn: Connection, batch: Batch) -> Queued:
    claimed = await claim_chunk(conn, batch)
    return claimed if isinstance(claimed, Queued) else await queue_chunk(conn, batch, claimed)


async def queue_batch(conn: Connection, batch: Batch) -> Queued:
    """One chunk, in one transaction."""
    try:
        async with conn.transaction():
            return await _queue(conn, batch)
    except _Lost:
        return Queued(False, 0, 0, 0)


async def queue_counted(conn: Connection, batch: Batch, quotas: QuotaDefaults) -> Queued:
    """One chunk and the team's email quota for what it queued, in one
    transaction. Raises QuotaExceeded, leaving nothing of the batch."""
    try:
        async with conn.transaction():
            queued = await _queue(conn, batch)
            if queued.queued:
                await claim_quota(conn, batch.team_id, "email", queued.queued, quotas)
    except _Lost:
        return Queued(False, 0, 0, 0)
    return queued
