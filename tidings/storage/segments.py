"""Segments of a team and their members.

A membership records when the contact was added (``assigned_at``); adding
a member again keeps it as it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from tidings.storage.connection import Connection, returned
from tidings.storage.contacts import CONTACT_COLUMNS, Contact

SEGMENT_COLUMNS = "s.id, s.team_id, s.name, s.created_at, s.updated_at"

# The count reads the primary key of segment_contacts only.
_COUNT = "(SELECT count(*) FROM segment_contacts m WHERE m.segment_id = s.id) AS contact_count"

INSERT_SEGMENT = """
INSERT INTO segments (team_id, name) VALUES ($1, $2)
RETURNING id, team_id, name, created_at, updated_at, 0::bigint AS contact_count
"""

SELECT_SEGMENT = f"""
SELECT {SEGMENT_COLUMNS}, {_COUNT} FROM segments s WHERE s.team_id = $1 AND s.id = $2
"""

SELECT_SEGMENTS = f"""
SELECT {SEGMENT_COLUMNS}, {_COUNT} FROM segments s
WHERE s.team_id = $1
ORDER BY s.created_at DESC, s.id DESC
LIMIT $2 OFFSET $3
"""

# KEY SHARE: the segment cannot be deleted before the transaction ends.
LOCK_SEGMENT = "SELECT id FROM segments WHERE team_id = $1 AND id = $2 FOR KEY SHARE"

DELETE_SEGMENT = "DELETE FROM segments WHERE team_id = $1 AND id = $2 RETURNING id"

# Adding again leaves the membership as it was; the no-op update makes
# RETURNING give the existing row, even one another transaction just added.
# KEY SHARE holds off a deletion of the segment or the contact until the
# membership is in (the deletion then removes it); one deleted meanwhile is
# not found, where the insert would break the foreign key.
ADD_MEMBER = """
WITH segment AS (
    SELECT id, team_id, name, created_at FROM segments WHERE team_id = $1 AND id = $2
    FOR KEY SHARE
), contact AS (
    SELECT id FROM contacts WHERE team_id = $1 AND id = $3
    FOR KEY SHARE
), added AS (
    INSERT INTO segment_contacts (segment_id, contact_id)
    SELECT segment.id, contact.id FROM segment, contact
    ON CONFLICT (segment_id, contact_id)
        DO UPDATE SET assigned_at = segment_contacts.assigned_at
    RETURNING assigned_at
)
SELECT (SELECT id FROM segment) AS id,
       (SELECT team_id FROM segment) AS team_id,
       (SELECT name FROM segment) AS name,
       (SELECT created_at FROM segment) AS created_at,
       EXISTS (SELECT 1 FROM contact) AS contact_found,
       (SELECT assigned_at FROM added) AS assigned_at
"""

REMOVE_MEMBER = """
WITH segment AS (
    SELECT id FROM segments WHERE team_id = $1 AND id = $2
), contact AS (
    SELECT id FROM contacts WHERE team_id = $1 AND id = $3
), removed AS (
    DELETE FROM segment_contacts m USING segment, contact
    WHERE m.segment_id = segment.id AND m.contact_id = contact.id
    RETURNING m.contact_id
)
SELECT EXISTS (SELECT 1 FROM segment) AS segment_found,
       EXISTS (SELECT 1 FROM contact) AS contact_found,
       EXISTS (SELECT 1 FROM removed) AS removed
"""

SELECT_MEMBERS = f"""
SELECT {", ".join("c." + name.strip() for name in CONTACT_COLUMNS.split(","))}
FROM segment_contacts m JOIN contacts c ON c.id = m.contact_id
WHERE m.segment_id = $1
ORDER BY m.assigned_at DESC, m.contact_id DESC
LIMIT $2 OFFSET $3
"""

SELECT_CONTACT_SEGMENTS = """
SELECT s.id, s.team_id, s.name, s.created_at, m.assigned_at
FROM segment_contacts m JOIN segments s ON s.id = m.segment_id
WHERE m.contact_id = $2 AND s.team_id = $1
ORDER BY m.assigned_at DESC, s.id DESC
LIMIT $3 OFFSET $4
"""


@dataclass(frozen=True)
class Segment:
    id: UUID
    team_id: UUID
    name: str
    created_at: datetime
    updated_at: datetime
    contact_count: int


@dataclass(frozen=True)
class Membership:
    """A segment as seen from one of its contacts: the segment and when it was joined."""

    id: UUID
    team_id: UUID
    name: str
    created_at: datetime
    assigned_at: datetime


class NoSegment(Exception):
    """No such segment in the team."""


class NoContact(Exception):
    """No such contact in the team."""


async def create_segment(conn: Connection, team_id: UUID, name: str) -> Segment:
    return Segment(**dict(returned(await conn.fetchrow(INSERT_SEGMENT, team_id, name))))


async def get_segment(conn: Connection, team_id: UUID, segment_id: UUID) -> Segment | None:
    row = await conn.fetchrow(SELECT_SEGMENT, team_id, segment_id)
    return None if row is None else Segment(**dict(row))


async def lock_segment(conn: Connection, team_id: UUID, segment_id: UUID) -> bool:
    """Whether the team has this segment; in a transaction, it then stays until
    the transaction ends (members can be added to it)."""
    return await conn.fetchval(LOCK_SEGMENT, team_id, segment_id) is not None


async def list_segments(conn: Connection, team_id: UUID, limit: int, offset: int) -> list[Segment]:
    rows = await conn.fetch(SELECT_SEGMENTS, team_id, limit, offset)
    return [Segment(**dict(row)) for row in rows]


async def delete_segment(conn: Connection, team_id: UUID, segment_id: UUID) -> bool:
    """Delete a segment and its memberships (not the contacts)."""
    return await conn.fetchval(DELETE_SEGMENT, team_id, segment_id) is not None


async def add_member(
    conn: Connection, team_id: UUID, segment_id: UUID, contact_id: UUID
) -> Membership:
    """Add a contact to a segment, or find it there already: the same membership
    either way. Raises NoContact or NoSegment."""
    row = returned(await conn.fetchrow(ADD_MEMBER, team_id, segment_id, contact_id))
    if not row["contact_found"]:
        raise NoContact()
    if row["id"] is None:
        raise NoSegment()
    return Membership(
        id=row["id"],
        team_id=row["team_id"],
        name=row["name"],
        created_at=row["created_at"],
        assigned_at=row["assigned_at"],
    )


async def remove_member(
    conn: Connection, team_id: UUID, segment_id: UUID, contact_id: UUID
) -> bool:
    """Remove a contact from a segment; False if it was not a member.
    Raises NoContact or NoSegment."""
    row = returned(await conn.fetchrow(REMOVE_MEMBER, team_id, segment_id, contact_id))
    if not row["contact_found"]:
        raise NoContact()
    if not row["segment_found"]:
        raise NoSegment()
    return bool(row["removed"])


async def list_members(
    conn: Connection, segment_id: UUID, limit: int, offset: int
) -> list[Contact]:
    """The contacts of a segment (the caller checks it is the team's), newest member first."""
    rows = await conn.fetch(SELECT_MEMBERS, segment_id, limit, offset)
    return [Contact.from_row(row) for row in rows]


async def contact_segments(
    conn: Connection, team_id: UUID, contact_id: UUID, limit: int, offset: int
) -> list[Membership]:
    """The segments a contact belongs to, the latest joined first."""
    rows = await conn.fetch(SELECT_CONTACT_SEGMENTS, team_id, contact_id, limit, offset)
    return [Membership(**dict(row)) for row in rows]
