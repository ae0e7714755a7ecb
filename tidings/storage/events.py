"""Events: the outbox every group writes to, in the transaction of its change.

Recording an event also creates one delivery for each enabled endpoint of
the team subscribed to its type, and wakes the endpoint actors of every
process with a NOTIFY that PostgreSQL sends only when the transaction
commits. A change rolled back leaves neither event nor delivery behind.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from tidings.storage.connection import Connection, Json, Row, returned
from tidings.storage.webhooks import DUE_CHANNEL
from tidings.webhooks.catalogue import ALL_EVENTS, EVENT_TYPES, TEST_EVENT


def name_id(name: str) -> str:
    """SQL for the id named by the text expression ``name``: an RFC 4122
    version 3 UUID (MD5 of the name, with the version and variant bits set).

    For rows that a statement makes many of at once and whose name is
    unique by construction (an email of a broadcast and its contact, the
    delivery of an event to an endpoint): ``gen_random_uuid()`` costs 3 µs
    a row where PostgreSQL is built without OpenSSL (it opens, reads and
    closes ``/dev/urandom`` for each id), MD5 a sixth of that, and a name
    makes the same id again when a statement is run again."""
    return (
        "(SELECT encode(set_byte(set_byte(h, 6, (get_byte(h, 6) & 15) | 48), "
        "8, (get_byte(h, 8) & 63) | 128), 'hex')::uuid "
        f"FROM (SELECT decode(md5({name}), 'hex') AS h) d)"
    )


# A delivery is named by its event and endpoint: one of each pair.
_DELIVERY_ID = name_id("event.id::text || endpoint.id::text")

EVENT_COLUMNS = "id, team_id, type, channel, message_id, recipient, occurred_at, data, created_at"

RECORD_EVENT = f"""
WITH event AS (
    INSERT INTO events (team_id, type, channel, message_id, recipient, occurred_at, data)
    VALUES ($1, $2, $3, $4, $5, coalesce($6, now()), $7::jsonb)
    RETURNING {EVENT_COLUMNS}
), fanout AS (
    INSERT INTO webhook_deliveries (id, team_id, endpoint_id, event_id, event_type,
                                    next_attempt_at)
    SELECT {_DELIVERY_ID}, event.team_id, endpoint.id, event.id, event.type, now()
    FROM event JOIN webhook_endpoints endpoint ON endpoint.team_id = event.team_id
    WHERE endpoint.status = 'enabled'
      AND CASE WHEN event.type = '{TEST_EVENT}'
               -- A test event goes to the endpoint it was asked for alone.
               THEN endpoint.id = $8
               ELSE endpoint.events @> ARRAY[event.type]
                    OR endpoint.events @> ARRAY['{ALL_EVENTS}'] END
    RETURNING endpoint_id
)
SELECT event.*,
       (SELECT count(pg_notify('{DUE_CHANNEL}', endpoint_id::text)) FROM fanout) AS deliveries
FROM event
"""

# Deliveries of the events in a CTE named ``event`` (id, team_id, type): one
# for each enabled endpoint of the event's team subscribed to its type, and a
# NOTIFY per endpoint that got any (sent when the transaction commits).
# Statements that record events set-based end with it; it defines the CTE
# ``woken`` (one row: how many endpoints were notified), which their final
# SELECT must read.
FANOUT = f"""
fanout AS (
    INSERT INTO webhook_deliveries (id, team_id, endpoint_id, event_id, event_type,
                                    next_attempt_at)
    SELECT {_DELIVERY_ID}, event.team_id, endpoint.id, event.id, event.type, now()
    FROM event JOIN webhook_endpoints endpoint ON endpoint.team_id = event.team_id
    WHERE endpoint.status = 'enabled'
      AND (endpoint.events @> ARRAY[event.type] OR endpoint.events @> ARRAY['{ALL_EVENTS}'])
    RETURNING endpoint_id
), woken AS (
    SELECT count(pg_notify('{DUE_CHANNEL}', endpoint_id::text)) AS woken
    FROM (SELECT DISTINCT endpoint_id FROM fanout) endpoints
)
"""

# Many events at once, with ids chosen by the caller (so that rows of its own
# can share them).
RECORD_EVENTS = f"""
WITH event AS (
    INSERT INTO events (id, team_id, type, channel, message_id, recipient, occurred_at, data)
    SELECT id, team_id, type, channel, message_id, recipient, coalesce(occurred_at, now()), data
    FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::uuid[], $6::text[],
                $7::timestamptz[], $8::jsonb[])
         AS i(id, team_id, type, channel, message_id, recipient, occurred_at, data)
    RETURNING id, team_id, type
), {FANOUT}
SELECT woken FROM woken
"""

SELECT_EVENT = f"SELECT {EVENT_COLUMNS} FROM events WHERE team_id = $1 AND id = $2"


@dataclass(frozen=True)
class Event:
    id: UUID
    team_id: UUID
    type: str
    channel: str | None
    message_id: UUID | None
    recipient: str | None
    occurred_at: datetime
    data: dict[str, Json]
    created_at: datetime

    @classmethod
    def from_row(cls, row: Row) -> Event:
        fields = {name: row[name] for name in EVENT_COLUMNS.split(", ")}
        fields["data"] = json.loads(fields["data"])
        return cls(**fields)


async def record_event(
    conn: Connection,
    team_id: UUID,
    type: str,
    *,
    channel: str | None = None,
    message_id: UUID | None = None,
    recipient: str | None = None,
    data: Mapping[str, object] | None = None,
    occurred_at: datetime | None = None,
    only_endpoint: UUID | None = None,
) -> tuple[Event, int]:
    """Record an event and its deliveries; returns the event and how many.

    Call it on the connection (and inside the transaction) of the state
    change that causes the event. ``only_endpoint`` is for ``webhook.test``,
    which goes to that one endpoint alone. ``type`` must be in the catalogue.
    """
    if type not in EVENT_TYPES:
        raise ValueError(f"{type!r} is not an event type of the catalogue")
    row = returned(await conn.fetchrow(
        RECORD_EVENT,
        team_id,
        type,
        channel,
        message_id,
        recipient,
        occurred_at,
        json.dumps(data or {}),
        only_endpoint,
    ))
    return Event.from_row(row), row["deliveries"]


@dataclass(frozen=True)
class NewEvent:
    """An event to record with ``record_events``; ``id`` is chosen by the caller."""

    id: UUID
    team_id: UUID
    type: str
    channel: str | None = None
    message_id: UUID | None = None
    recipient: str | None = None
    occurred_at: datetime | None = None
    data: Mapping[str, object] | None = None


async def record_events(conn: Connection, events: Sequence[NewEvent]) -> int:
    """Record many events and their deliveries in one statement; returns how
    many endpoints were woken.

    The set-based form of ``record_event``, for work that changes many
    messages at once: same transaction rule, same catalogue check.
    """
    if not events:
        return 0
    for event in events:
        if event.type not in EVENT_TYPES:
            raise ValueError(f"{event.type!r} is not an event type of the catalogue")
    woken: int = await conn.fetchval(
        RECORD_EVENTS,
        [e.id for e in events],
        [e.team_id for e in events],
        [e.type for e in events],
        [e.channel for e in events],
        [e.message_id for e in events],
        [e.recipient for e in events],
        [e.occurred_at for e in events],
        [json.dumps(e.data or {}) for e in events],
    )
    return woken


async def get_event(conn: Connection, team_id: UUID, event_id: UUID) -> Event | None:
    row = await conn.fetchrow(SELECT_EVENT, team_id, event_id)
    return None if row is None else Event.from_row(row)


async def list_events(
    conn: Connection,
    team_id: UUID,
    limit: int,
    offset: int,
    *,
    type: str | None = None,
    message_id: UUID | None = None,
) -> list[Event]:
    # Newest first. The events of one transaction share ``created_at``; their
    # ``occurred_at`` says which came first (a message's moves are stamped
    # apart), the id only breaks what is left.
    rows = await conn.fetch(
        f"""
        SELECT {EVENT_COLUMNS} FROM events
        WHERE team_id = $1
          AND ($2::text IS NULL OR type = $2)
          AND ($3::uuid IS NULL OR message_id = $3)
        ORDER BY created_at DESC, occurred_at DESC, id DESC
        LIMIT $4 OFFSET $5
        """,
        team_id,
        type,
        message_id,
        limit,
        offset,
    )
    return [Event.from_row(row) for row in rows]
