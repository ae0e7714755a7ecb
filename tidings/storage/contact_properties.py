"""Contact property definitions: the keys a team's contacts may carry in
``properties``, each with a type and an optional fallback value."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Literal
from uuid import UUID

from tidings.storage.connection import Connection, Json, Row, returned
from tidings.storage.errors import unique

PropertyType = Literal["string", "number", "boolean", "date"]
PROPERTY_TYPES: tuple[str, ...] = ("string", "number", "boolean", "date")

COLUMNS = "id, team_id, key, type, fallback_value, created_at, updated_at"

INSERT_PROPERTY = f"""
INSERT INTO contact_properties (team_id, key, type, fallback_value)
VALUES ($1, $2, $3, $4::jsonb)
RETURNING {COLUMNS}
"""

SELECT_PROPERTY = f"SELECT {COLUMNS} FROM contact_properties WHERE team_id = $1 AND id = $2"

SELECT_PROPERTIES = f"""
SELECT {COLUMNS} FROM contact_properties
WHERE team_id = $1
ORDER BY created_at DESC, id DESC
LIMIT $2 OFFSET $3
"""

SELECT_TYPES = "SELECT key, type FROM contact_properties WHERE team_id = $1"

UPDATE_FALLBACK = f"""
UPDATE contact_properties SET fallback_value = $3::jsonb, updated_at = now()
WHERE team_id = $1 AND id = $2
RETURNING {COLUMNS}
"""

# A deletion is two statements in one transaction. The first deletes the
# definition, and so waits for every writer holding it (a contact's write
# locks the definitions of the keys it sets, FOR KEY SHARE: see
# tidings.storage.contacts) and makes every later one wait, then find it gone.
DELETE_PROPERTY = "DELETE FROM contact_properties WHERE team_id = $1 AND id = $2 RETURNING key"

# The second removes key $2 from every contact of the team: a statement of its
# own, so that its snapshot has the contacts of the writers the first waited
# for. It locks them in the order of their ids, as the import locks the
# contacts it updates, so that neither waits for the other in a circle.
CLEAR_KEY = """
WITH holders AS (
    SELECT id FROM contacts WHERE team_id = $1 AND properties ? $2
    ORDER BY id
    FOR NO KEY UPDATE
), cleared AS (
    UPDATE contacts c SET properties = c.properties - $2, updated_at = now()
    FROM holders h
    WHERE c.id = h.id
    RETURNING c.id
)
SELECT count(*) FROM cleared
"""


@dataclass(frozen=True)
class ContactProperty:
    id: UUID
    team_id: UUID
    key: str
    type: PropertyType
    fallback_value: Json
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: Row) -> ContactProperty:
        fields = dict(row)
        raw = fields["fallback_value"]
        fields["fallback_value"] = None if raw is None else json.loads(raw)
        return cls(**fields)


def _json_or_null(value: Json) -> str | None:
    return None if value is None else json.dumps(value)


async def create_property(
    conn: Connection, team_id: UUID, key: str, kind: PropertyType, fallback_value: Json
) -> ContactProperty:
    """Define a property. Raises Duplicate if the team has one with this key."""
    with unique("key", f"a contact property with key {key!r} exists already"):
        row = await conn.fetchrow(
            INSERT_PROPERTY, team_id, key, kind, _json_or_null(fallback_value)
        )
    return ContactProperty.from_row(returned(row))


async def get_property(
    conn: Connection, team_id: UUID, property_id: UUID
) -> ContactProperty | None:
    row = await conn.fetchrow(SELECT_PROPERTY, team_id, property_id)
    return None if row is None else ContactProperty.from_row(row)


async def list_properties(
    conn: Connection, team_id: UUID, limit: int, offset: int
) -> list[ContactProperty]:
    rows = await conn.fetch(SELECT_PROPERTIES, team_id, limit, offset)
    return [ContactProperty.from_row(row) for row in rows]


async def property_types(conn: Connection, team_id: UUID) -> dict[str, PropertyType]:
    """Every key the team has defined, with its type."""
    rows = await conn.fetch(SELECT_TYPES, team_id)
    return {row["key"]: row["type"] for row in rows}


async def update_fallback(
    conn: Connection, team_id: UUID, property_id: UUID, fallback_value: Json
) -> ContactProperty | None:
    row = await conn.fetchrow(UPDATE_FALLBACK, team_id, property_id, _json_or_null(fallback_value))
    return None if row is None else ContactProperty.from_row(row)


async def delete_property(conn: Connection, team_id: UUID, property_id: UUID) -> int | None:
    """Delete a definition and its key from every contact of the team. The
    number of contacts that lost a value, or None if no such definition.

    Run it in a transaction: a write of the key that meets the deletion either
    commits before it (and loses its value) or is refused. Cancelled or
    failing, the transaction leaves nothing."""
    key: str | None = await conn.fetchval(DELETE_PROPERTY, team_id, property_id)
    if key is None:
        return None
    cleared: int = await conn.fetchval(CLEAR_KEY, team_id, key)
    return cleared
