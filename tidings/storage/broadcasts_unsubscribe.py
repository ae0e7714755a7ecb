"""Unsubscribing through a broadcast's link, and the key that signs the links.

With a topic, the contact opts out of that topic (the one choice a topic
records per contact); without one, the contact is ``unsubscribed`` from
every broadcast. Either way it is one statement, and doing it twice is the
same as once.
"""

from __future__ import annotations

from uuid import UUID

from tidings.storage.connection import Connection

# The key named $1: the one stored, or $2 stored now if none was.
SERVICE_KEY = """
WITH made AS (
    INSERT INTO service_keys (name, key) VALUES ($1, $2)
    ON CONFLICT (name) DO NOTHING
    RETURNING key
)
SELECT key FROM made UNION ALL SELECT key FROM service_keys WHERE name = $1 LIMIT 1
"""

# $1 team, $2 contact, $3 topic (NULL: every broadcast). Returns the
# contact's email, or no row when the team has no such contact.
UNSUBSCRIBE = """
WITH contact AS (
    SELECT id, email FROM contacts WHERE team_id = $1 AND id = $2
), from_all AS (
    UPDATE contacts c SET unsubscribed = true, updated_at = now()
    FROM contact WHERE c.id = contact.id AND $3::uuid IS NULL AND NOT c.unsubscribed
), from_topic AS (
    INSERT INTO topic_subscriptions (topic_id, contact_id, subscription)
    SELECT t.id, contact.id, 'opt_out'
    FROM contact JOIN topics t ON t.id = $3 AND t.team_id = $1
    ON CONFLICT (topic_id, contact_id)
    DO UPDATE SET subscription = 'opt_out', updated_at = now()
)
SELECT email FROM contact
"""

TOPIC_NAME = "SELECT name FROM topics WHERE team_id = $1 AND id = $2"


async def service_key(conn: Connection, name: str, candidate: bytes) -> bytes:
    """The stored key ``name``; ``candidate`` becomes it if there is none yet.
    Processes racing to create it all end with the one that won."""
    for _ in range(2):
        key: bytes | None = await conn.fetchval(SERVICE_KEY, name, candidate)
        if key is not None:
            return bytes(key)
    raise RuntimeError(f"the service key {name!r} could not be read or stored")


async def unsubscribe(
    conn: Connection, team_id: UUID, contact_id: UUID, topic_id: UUID | None
) -> bool:
    """Unsubscribe the contact; False when the team has no such contact."""
    rows = await conn.fetch(UNSUBSCRIBE, team_id, contact_id, topic_id)
    return bool(rows)


async def topic_name(conn: Connection, team_id: UUID, topic_id: UUID) -> str | None:
    name: str | None = await conn.fetchval(TOPIC_NAME, team_id, topic_id)
    return name
