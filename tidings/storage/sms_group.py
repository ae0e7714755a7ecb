"""Acceptance of several text messages of one team in one statement: the
group commit of ``POST /sms`` (``tidings.gathering``).

Each message is checked as ``accept`` checks one (an approved sender ID of
the team, a recipient who has not opted out), and all of them are counted on
one stripe of the team's quota. The messages are stored, with their
``queued`` events, only if every check passed and a stripe counted them
all; otherwise nothing is, ``NotAllStored`` says so, and each message is
then accepted alone (which finds its own answer: refused, or stored, or
counted on the quota's slow path).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from uuid import UUID

from tidings.config import QuotaDefaults
from tidings.storage import quotas
from tidings.storage.connection import Connection
from tidings.storage.emails import Clock
from tidings.storage.quota_stripes import fast_claim_sql
from tidings.storage.sms import CHECK, DUE_CHANNEL, SMS_COLUMNS, NewSms, Sms, accept
from tidings.storage.sms_status import CHANGE_ROWS, RECORDED, Change, change_args, event_data

# $1..$10 the events (ACCEPT's), $11.. one array per column of the messages,
# $12 the team, $22/$23 the UTC day and month, $24/$25 the default limits,
# $26 how many messages.
_QUOTA, _ = fast_claim_sql(
    ready=" AND NOT EXISTS (SELECT 1 FROM checked WHERE ready IS NOT TRUE)",
    team="$12::uuid", channel="'sms'", n="$26::bigint", day="$22::date", month="$23::date",
    per_day="$24::bigint", per_month="$25::bigint",
)
_SPELLINGS = "ARRAY(SELECT jsonb_array_elements_text(m.spellings))"
# The LIMIT of the messages' rows (the arrays' length) changes no result,
# only the plan: PostgreSQL counts on 10 rows from an ``unnest`` of a
# parameter and on a tenth of that under a LIMIT it cannot compute, so the
# plan made once for every execution (the generic plan) counts on one row
# and wins against a plan made for each execution's arrays, whose making
# cost about a quarter of PostgreSQL's time for an accepted text message
# (``docs/benchmarks.md``, "Plans made once").
ACCEPT_GROUP = f"""
WITH checked AS MATERIALIZED (
    SELECT m.*, c.sender, c.sender_status = 'approved' AND NOT c.opted_out AS ready
    FROM (SELECT * FROM unnest($11::uuid[], $13::text[], $14::text[], $15::jsonb[], $16::text[],
                               $17::text[], $18::int[], $19::text[], $20::text[],
                               $21::timestamptz[])
              AS m(id, to_number, country, spellings, body, encoding, segments, provider,
                   metadata, scheduled_at)
          LIMIT cardinality($11::uuid[])) m
    CROSS JOIN LATERAL ({CHECK.format(team="$12::uuid", spellings=_SPELLINGS, to="m.to_number")}) c
), change_rows AS ({CHANGE_ROWS}), {_QUOTA}, change AS (
    SELECT c.id, c.sms_id, c.team_id, c.status, c.recipient, c.occurred_at, c.provider, c.code,
           c.message, c.data || jsonb_build_object('from', k.sender) AS data
    FROM change_rows c
    JOIN checked k ON k.id = c.sms_id
    WHERE EXISTS (SELECT 1 FROM quota_counted)
), inserted AS (
    INSERT INTO sms_messages (id, team_id, to_number, country, from_sender, body, encoding,
                              segments, status, provider, metadata, scheduled_at,
                              next_attempt_at, created_at, updated_at)
    SELECT k.id, $12, k.to_number, k.country, k.sender, k.body, k.encoding, k.segments,
           'queued', k.provider, k.metadata::jsonb, k.scheduled_at,
           coalesce(k.scheduled_at, now()), least(now(), c.occurred_at), now()
    FROM checked k JOIN change c ON c.sms_id = k.id
    RETURNING {SMS_COLUMNS}
), {RECORDED}
SELECT inserted.*, (SELECT woken FROM woken),
       (SELECT count(pg_notify('{DUE_CHANNEL}', $12::text))
        FROM (SELECT 1 FROM inserted WHERE scheduled_at IS NULL LIMIT 1) due) AS senders
FROM inserted
"""


class NotAllStored(Exception):
    """A group of messages was not stored: a check or the quota's fast path
    refused one of them (or all)."""


async def accept_group(
    conn: Connection, team_id: UUID, messages: Sequence[NewSms], defaults: QuotaDefaults
) -> list[Sms]:
    """Check and store ``messages`` as one unit, counted against the team's
    quota, or raise NotAllStored with nothing stored. One message is
    accepted as ``accept`` does (its refusals raised as they are)."""
    if len(messages) == 1:
        return [await accept(conn, team_id, messages[0], defaults)]
    clock = Clock()
    changes = [
        Change(m.id, team_id, "queued", m.to, clock.tick(), m.provider,
               event_data(m.id, m.sender_candidates[0], m.to, m.segments, "queued"))
        for m in messages
    ]
    quota = quotas.claim_args(team_id, "sms", len(messages), defaults, changes[0].occurred_at)
    rows = await conn.fetch(
        ACCEPT_GROUP, *change_args(changes),
        [m.id for m in messages], team_id, [m.to for m in messages],
        [m.country for m in messages], [json.dumps(m.sender_candidates) for m in messages],
        [m.body for m in messages], [m.encoding for m in messages],
        [m.segments for m in messages], [m.provider for m in messages],
        [None if m.metadata is None else json.dumps(m.metadata) for m in messages],
        [m.scheduled_at for m in messages], *quota[3:], len(messages),
    )
    if len(rows) != len(messages):
        raise NotAllStored()
    stored = {row["id"]: Sms.from_row(row) for row in rows}
    return [stored[m.id] for m in messages]
