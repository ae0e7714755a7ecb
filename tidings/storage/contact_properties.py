"""Contact property definitions: the keys a team's contacts may carry in
``properties``, each with a type and an optional fallback value."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

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

# The definition goes, and so does its key in every contact of the team.
DELETE_PROPERTY = """
WITH deleted AS (
    DELETE FROM contact_properties WHERE team_id = $1 AND id = $2 RETURNING key
), cleared AS (
    UPDATE contacts c SET properties = c.properties - d.key, updated_at = now()
    FROM deleted d
    WHERE c.team_id = $1 AND c.properties ? d.key
    RETURNING c.id
)
SELECT (SELECT key FROM deleted) AS key, (SELECT count(*) FROM cleared) AS cleared
"""


@dataclass(frozen=True)
class ContactProperty:
    id: UUID
    team_id: UUID
    key: str
    type: PropertyType
    fallback_value: Any
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: Any) -> ContactProperty:
        fields = dict(row)
        raw = fields["fallback_value"]
        fields["fallback_value"] = None if raw is None else json.loads(raw)
        return cls(**fields)


def _json_or_null(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


async def create_property(
    conn: Any, team_id: UUID, key: str, kind: PropertyType, fallback_value: Any
) -> ContactProperty:
    """Define a property. Raises Duplicate if the team has one with this key."""
    with unique("key", f"a contact property with key {key!r} exists already"):
        row = await conn.fetchrow(
            INSERT_PROPERTY, team_id, key, kind, _json_or_null(fallback_value)
        )
    return ContactProperty.from_row(row)


async def get_property(conn: Any, team_id: UUID, property_id: UUID) -> ContactProperty | None:
    row = await conn.fetchrow(SELECT_PROPERTY, team_id, property_id)
    return None if row is None else ContactProperty.from_row(row)


async def list_properties(
    conn: Any, team_id: UUID, limit: int, offset: int
) -> list[ContactProperty]:
    rows = await conn.fetch(SELECT_PROPERTIES, team_id, limit, offset)
    return [ContactProperty.from_row(row) for row in rows]


async def property_types(conn: Any, team_id: UUID) -> dict[str, PropertyType]:
    """Every key the team has defined, with its type."""
    rows = await conn.fetch(SELECT_TYPES, team_id)
    return {row["key"]: row["type"] for row in rows}


async def update_fallback(
    conn: Any, team_id: UUID, property_id: UUID, fallback_value: Any
) -> ContactProperty | None:
    row = await conn.fetchrow(UPDATE_FALLBACK, team_id, property_id, _json_or_null(fallback_value))
    return None if row is None else ContactProperty.from_row(row)


async def delete_property(conn: Any, team_id: UUID, property_id: UUID) -> int | None:
    """Delete a definition and its key from every contact of the team, in one
    statement. The number of contacts that lost a value, or None if no such
    definition."""
    row = await conn.fetchrow(DELETE_PROPERTY, team_id, property_id)
    return None if row["key"] is None else int(row["cleared"])
