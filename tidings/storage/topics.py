"""Topics of a team and each contact's choice per topic.

Only explicit choices are stored. A contact without one has the topic's
``default_subscription``: ``opt_in`` topics reach every contact who has not
opted out, ``opt_out`` topics only those who opted in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal
from uuid import UUID

from tidings.storage.connection import Connection, returned

Subscription = Literal["opt_in", "opt_out"]

COLUMNS = "id, team_id, name, description, default_subscription, created_at, updated_at"

INSERT_TOPIC = f"""
INSERT INTO topics (team_id, name, description, default_subscription)
VALUES ($1, $2, $3, $4)
RETURNING {COLUMNS}
"""

SELECT_TOPIC = f"SELECT {COLUMNS} FROM topics WHERE team_id = $1 AND id = $2"

SELECT_TOPICS = f"""
SELECT {COLUMNS} FROM topics
WHERE team_id = $1
ORDER BY created_at DESC, id DESC
LIMIT $2 OFFSET $3
"""

UPDATE_TOPIC = f"""
UPDATE topics SET
    name = COALESCE($3, name),
    description = CASE WHEN $4 THEN $5 ELSE description END,
    default_subscription = COALESCE($6, default_subscription),
    updated_at = now()
WHERE team_id = $1 AND id = $2
RETURNING {COLUMNS}
"""

DELETE_TOPIC = "DELETE FROM topics WHERE team_id = $1 AND id = $2 RETURNING id"

# Every topic of the team, with the contact's explicit choice if any.
SELECT_CONTACT_TOPICS = """
SELECT t.id, t.name, t.description, t.default_subscription, s.subscription AS choice
FROM topics t
LEFT JOIN topic_subscriptions s ON s.topic_id = t.id AND s.contact_id = $2
WHERE t.team_id = $1 AND ($5::uuid[] IS NULL OR t.id = ANY($5))
ORDER BY t.created_at DESC, t.id DESC
LIMIT $3 OFFSET $4
"""

# KEY SHARE: the topics found cannot be deleted before the transaction ends,
# so that the choices recorded next keep their foreign key.
LOCK_TOPICS = """
WITH found AS (
    SELECT id FROM topics WHERE team_id = $1 AND id = ANY($2::uuid[]) FOR KEY SHARE
)
SELECT ARRAY(
    SELECT wanted.id FROM unnest($2::uuid[]) WITH ORDINALITY AS wanted(id, n)
    WHERE wanted.id NOT IN (SELECT id FROM found)
    ORDER BY wanted.n
)
"""

# $2/$3: topics and choices to record; $4: topics whose choice is removed.
SET_CHOICES = """
WITH recorded AS (
    INSERT INTO topic_subscriptions (topic_id, contact_id, subscription)
    SELECT chosen.topic_id, $1, chosen.subscription
    FROM unnest($2::uuid[], $3::text[]) AS chosen(topic_id, subscription)
    ON CONFLICT (topic_id, contact_id)
        DO UPDATE SET subscription = EXCLUDED.subscription, updated_at = now()
    RETURNING topic_id
), removed AS (
    DELETE FROM topic_subscriptions WHERE contact_id = $1 AND topic_id = ANY($4::uuid[])
    RETURNING topic_id
)
SELECT (SELECT count(*) FROM recorded) + (SELECT count(*) FROM removed)
"""

def not_opted_in(topic_id: str, contact_id: str) -> str:
    """SQL: true unless the contact's choice for the topic, or else the
    topic's default, is ``opt_in`` (also true when the topic is gone). Both
    arguments are SQL expressions; a NULL ``topic_id`` is the caller's to test."""
    return f"""(coalesce(
    (SELECT ts.subscription FROM topic_subscriptions ts
     WHERE ts.topic_id = {topic_id} AND ts.contact_id = {contact_id}),
    (SELECT tp.default_subscription FROM topics tp WHERE tp.id = {topic_id}))
    IS DISTINCT FROM 'opt_in')"""


# The set-based question of the sending paths.
SUBSCRIBED = """
SELECT c.id
FROM topics t
CROSS JOIN unnest($3::uuid[]) AS wanted(id)
JOIN contacts c ON c.id = wanted.id AND c.team_id = t.team_id
LEFT JOIN topic_subscriptions s ON s.topic_id = t.id AND s.contact_id = c.id
WHERE t.team_id = $1 AND t.id = $2
  AND COALESCE(s.subscription, t.default_subscription) = 'opt_in'
"""


@dataclass(frozen=True)
class Topic:
    id: UUID
    team_id: UUID
    name: str
    description: str | None
    default_subscription: Subscription
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class ContactTopic:
    """A topic as one contact has it: the effective choice, and whether it is
    the topic's default (no explicit choice recorded)."""

    id: UUID
    name: str
    description: str | None
    default_subscription: Subscription
    subscription: Subscription
    is_default: bool


async def create_topic(
    conn: Connection, team_id: UUID, name: str, description: str | None, default: Subscription
) -> Topic:
    row = await conn.fetchrow(INSERT_TOPIC, team_id, name, description, default)
    return Topic(**dict(returned(row)))


async def get_topic(conn: Connection, team_id: UUID, topic_id: UUID) -> Topic | None:
    row = await conn.fetchrow(SELECT_TOPIC, team_id, topic_id)
    return None if row is None else Topic(**dict(row))


async def list_topics(conn: Connection, team_id: UUID, limit: int, offset: int) -> list[Topic]:
    return [Topic(**dict(row)) for row in await conn.fetch(SELECT_TOPICS, team_id, limit, offset)]


async def update_topic(
    conn: Connection,
    team_id: UUID,
    topic_id: UUID,
    *,
    name: str | None,
    description_given: bool,
    description: str | None,
    default: Subscription | None,
) -> Topic | None:
    row = await conn.fetchrow(
        UPDATE_TOPIC, team_id, topic_id, name, description_given, description, default
    )
    return None if row is None else Topic(**dict(row))


async def delete_topic(conn: Connection, team_id: UUID, topic_id: UUID) -> bool:
    """Delete a topic and every contact's choice for it."""
    return await conn.fetchval(DELETE_TOPIC, team_id, topic_id) is not None


async def contact_topics(
    conn: Connection,
    team_id: UUID,
    contact_id: UUID,
    limit: int,
    offset: int,
    only: Sequence[UUID] | None = None,
) -> list[ContactTopic]:
    """The team's topics (or ``only`` these) with the contact's effective choice,
    newest topic first. The caller checks the contact is the team's."""
    rows = await conn.fetch(
        SELECT_CONTACT_TOPICS, team_id, contact_id, limit, offset,
        None if only is None else list(only),
    )
    return [
        ContactTopic(
            id=row["id"],
            name=row["name"],
            description=row["description"],
            default_subscription=row["default_subscription"],
            subscription=row["choice"] or row["default_subscription"],
            is_default=row["choice"] is None,
        )
        for row in rows
    ]


async def lock_topics(conn: Connection, team_id: UUID, topic_ids: Sequence[UUID]) -> list[UUID]:
    """Those of ``topic_ids`` that are not topics of the team, in the order given.
    In a transaction, the others then stay until it ends (choices can be
    recorded for them)."""
    return list(await conn.fetchval(LOCK_TOPICS, team_id, list(topic_ids)))


async def set_choices(
    conn: Connection, contact_id: UUID, choices: dict[UUID, Subscription | None]
) -> None:
    """Record a contact's choices; None removes the choice (back to the default).

    The caller, in the same transaction, has locked the contact
    (``contacts.lock_contact``) and every topic (``lock_topics``): the team's,
    and none deleted before the choices are in.
    """
    recorded = [(topic, choice) for topic, choice in choices.items() if choice is not None]
    removed = [topic for topic, choice in choices.items() if choice is None]
    await conn.fetchval(
        SET_CHOICES,
        contact_id,
        [topic for topic, _ in recorded],
        [choice for _, choice in recorded],
        removed,
    )


async def subscribed_contacts(
    conn: Connection, team_id: UUID, topic_id: UUID, contact_ids: Sequence[UUID]
) -> set[UUID]:
    """Which of ``contact_ids`` (contacts of the team) are subscribed to topic
    ``topic_id``: by their explicit choice, else by the topic's default. One
    query, whatever the number of contacts.

    Only the topic is considered here; a contact's ``unsubscribed`` flag and
    suppressed addresses are separate checks. An unknown topic (or another
    team's) subscribes nobody.
    """
    rows = await conn.fetch(SUBSCRIBED, team_id, topic_id, list(contact_ids))
    return {row["id"] for row in rows}
