"""Contacts of a team: one at a time, and listed with filters (the bulk import
is ``tidings.storage.contact_import``).

A contact is named by its id or by its email (case-insensitively); a
``ContactRef`` is either. Emails are unique per team, case-insensitively.

Case is folded by PostgreSQL's ``lower()`` alone, as the unique index on
``lower(email)`` does it, never by Python's ``str.lower``: the two differ
(``İ``, U+0130, is ``i`` for one and ``i`` + U+0307 for the other).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

import asyncpg

from tidings.storage.connection import Connection, Json, Row, returned
from tidings.storage.contact_properties import PropertyType
from tidings.storage.errors import unique
from tidings.storage.sms_consent import STOP, share_consent_lock

CONTACT_COLUMNS = """
id, team_id, email, phone, normalized_phone, phone_country, sms_consent_status,
sms_consent_updated_at, sms_consent_source, first_name, last_name, unsubscribed,
properties, created_at, updated_at
"""

# A write of a contact's properties first locks the definitions of the keys it
# sets, as the types their values were checked as (KEY SHARE, until its
# transaction ends), and writes nothing unless it has them all: a deletion of
# one (tidings.storage.contact_properties) waits for the write and then
# removes its value, or the write waits for the deletion and finds the
# definition gone. The statement answers the keys it did not find in `gone`.
# Here $12 are the keys, $13 their types.
# A number that replied STOP (``stop``, its suppression's ``sms_opted_out_at``)
# gives a contact with no consent of its own ``opted_out``; ``opted_in`` is
# refused (the row is not written and ``stop_at`` says why). A write that
# gives a number or a status first shares the team's consent lock in its
# transaction, so that no STOP is in flight when it reads
# (tidings.storage.sms_consent).

INSERT_CONTACT = f"""
WITH defined AS (
    SELECT key FROM contact_properties
    WHERE team_id = $1 AND (key, type) IN (SELECT * FROM unnest($12::text[], $13::text[]))
    FOR KEY SHARE
), {STOP.format(phone="$4")}, inserted AS (
    INSERT INTO contacts (team_id, email, phone, normalized_phone, phone_country,
                          sms_consent_status, sms_consent_updated_at, sms_consent_source,
                          first_name, last_name, unsubscribed, properties)
    SELECT $1, $2, $3, $4, $5,
           CASE WHEN stop.at IS NOT NULL AND $6 = 'unknown' THEN 'opted_out' ELSE $6 END,
           CASE WHEN stop.at IS NOT NULL AND $6 = 'unknown' THEN stop.at
                WHEN $6 = 'unknown' THEN NULL ELSE now() END,
           CASE WHEN stop.at IS NOT NULL AND $6 = 'unknown' THEN 'keyword'
                WHEN $6 = 'unknown' THEN NULL ELSE $7 END,
           $8, $9, $10, $11::jsonb
    FROM stop
    WHERE (SELECT count(*) FROM defined) = cardinality($12::text[])
      AND NOT (stop.at IS NOT NULL AND $6 = 'opted_in')
    RETURNING {CONTACT_COLUMNS}
)
SELECT inserted.*, ARRAY(SELECT unnest($12::text[]) EXCEPT SELECT key FROM defined) AS gone,
       (SELECT at FROM stop) AS stop_at
FROM (SELECT) AS one LEFT JOIN inserted ON true
"""

# A contact is named by its id or, case-insensitively, by its email: $2 is
# the id or NULL, $3 the email or NULL.
TARGET = """
SELECT id FROM contacts WHERE team_id = $1 AND id = $2
UNION ALL
SELECT id FROM contacts WHERE team_id = $1 AND lower(email) = lower($3)
LIMIT 1
"""

ContactRef = UUID | str

SELECT_CONTACT = f"""
SELECT {CONTACT_COLUMNS} FROM contacts WHERE team_id = $1 AND id = ({TARGET})
"""

# Filters: $2 email (any case), $3 unsubscribed, $4 search (a LIKE
# pattern); NULL means no filter. Three shapes, so that each can use its index.
_FILTERS = """
    AND ($3::boolean IS NULL OR c.unsubscribed = $3)
    AND ($4::text IS NULL
         OR c.email ILIKE $4 OR c.first_name ILIKE $4 OR c.last_name ILIKE $4
         OR concat_ws(' ', c.first_name, c.last_name) ILIKE $4)
"""

SELECT_CONTACTS = f"""
SELECT {CONTACT_COLUMNS} FROM contacts c
WHERE c.team_id = $1 AND ($2::text IS NULL OR lower(c.email) = lower($2))
{_FILTERS}
ORDER BY c.created_at DESC, c.id DESC
LIMIT $5 OFFSET $6
"""

SELECT_CONTACTS_BY_EMAIL = f"""
SELECT {CONTACT_COLUMNS} FROM contacts c
WHERE c.team_id = $1 AND lower(c.email) = lower($2)
{_FILTERS}
LIMIT $5 OFFSET $6
"""

SELECT_SEGMENT_CONTACTS_FILTERED = f"""
SELECT {", ".join("c." + name.strip() for name in CONTACT_COLUMNS.split(","))}
FROM segment_contacts m JOIN contacts c ON c.id = m.contact_id
WHERE m.segment_id = $7 AND c.team_id = $1
  AND ($2::text IS NULL OR lower(c.email) = lower($2))
{_FILTERS}
ORDER BY c.created_at DESC, c.id DESC
LIMIT $5 OFFSET $6
"""

# PATCH: for each nullable field a flag says whether it was given ($n) and
# its new value follows ($n+1). The consent timestamp and source change only
# when the status does. The keys set ($19, of types $20) are locked as in
# INSERT_CONTACT, before the contact. Without a new phone the STOP is that of
# the number the contact has once it is locked, not the one it had when the
# statement began (a PATCH of its phone in flight).
UPDATE_CONTACT = f"""
WITH defined AS (
    SELECT key FROM contact_properties
    WHERE team_id = $1 AND (key, type) IN (SELECT * FROM unnest($19::text[], $20::text[]))
    FOR KEY SHARE
), {STOP.format(phone=f"CASE WHEN $6 THEN $8 ELSE ("
                      f"SELECT normalized_phone FROM contacts WHERE team_id = $1 "
                      f"AND id = ({TARGET}) FOR NO KEY UPDATE) END")}, updated AS (
    UPDATE contacts SET
        email = CASE WHEN $4 THEN $5 ELSE email END,
        phone = CASE WHEN $6 THEN $7 ELSE phone END,
        normalized_phone = CASE WHEN $6 THEN $8 ELSE normalized_phone END,
        phone_country = CASE WHEN $6 THEN $9 ELSE phone_country END,
        first_name = CASE WHEN $10 THEN $11 ELSE first_name END,
        last_name = CASE WHEN $12 THEN $13 ELSE last_name END,
        unsubscribed = COALESCE($14, unsubscribed),
        sms_consent_status = CASE WHEN stop.at IS NOT NULL THEN 'opted_out'
                                  ELSE COALESCE($15, sms_consent_status) END,
        sms_consent_updated_at = CASE
            WHEN stop.at IS NOT NULL AND COALESCE($15, sms_consent_status) <> 'opted_out'
                THEN stop.at
            WHEN $15 <> sms_consent_status THEN now() ELSE sms_consent_updated_at END,
        sms_consent_source = CASE
            WHEN stop.at IS NOT NULL AND COALESCE($15, sms_consent_status) <> 'opted_out'
                THEN 'keyword'
            WHEN $15 <> sms_consent_status THEN $16 ELSE sms_consent_source END,
        properties = (properties || $17::jsonb) - $18::text[],
        updated_at = now()
    FROM stop
    WHERE team_id = $1 AND id = ({TARGET})
      AND (SELECT count(*) FROM defined) = cardinality($19::text[])
      AND NOT (stop.at IS NOT NULL AND $15 IS NOT DISTINCT FROM 'opted_in')
    RETURNING {CONTACT_COLUMNS}
)
SELECT updated.*, ARRAY(SELECT unnest($19::text[]) EXCEPT SELECT key FROM defined) AS gone,
       (SELECT at FROM stop) AS stop_at
FROM (SELECT) AS one LEFT JOIN updated ON true
"""

# KEY SHARE: the contact cannot be deleted (nor its id change) before the
# transaction ends, so that rows added for it keep their foreign key.
LOCK_CONTACT = f"""
SELECT id FROM contacts WHERE team_id = $1 AND id = ({TARGET}) FOR KEY SHARE
"""

DELETE_CONTACT = f"""
DELETE FROM contacts WHERE team_id = $1 AND id = ({TARGET}) RETURNING id
"""

@dataclass(frozen=True)
class Contact:
    id: UUID
    team_id: UUID
    email: str | None
    phone: str | None
    normalized_phone: str | None
    phone_country: str | None
    sms_consent_status: str
    sms_consent_updated_at: datetime | None
    sms_consent_source: str | None
    first_name: str | None
    last_name: str | None
    unsubscribed: bool
    properties: dict[str, Json]
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: Row) -> Contact:
        fields = dict(row)
        fields["properties"] = json.loads(fields["properties"])
        return cls(**fields)


@dataclass(frozen=True)
class NewContact:
    email: str | None
    phone: str | None
    normalized_phone: str | None
    phone_country: str | None
    sms_consent_status: str
    sms_consent_source: str
    first_name: str | None
    last_name: str | None
    unsubscribed: bool
    properties: dict[str, Json]
    # The type each key of ``properties`` was checked as.
    property_types: Mapping[str, PropertyType]


class PropertyGone(Exception):
    """A key the write sets is no longer defined with the type its value was
    checked as: its definition was deleted meanwhile. Nothing was written."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _definitions(
    values: Mapping[str, Json], types: Mapping[str, PropertyType]
) -> tuple[list[str], list[str]]:
    """The keys of ``values`` and their types, as the statements take them."""
    return list(values), [types[key] for key in values]


class StopStands(Exception):
    """The contact's number replied STOP at ``at``: it cannot be ``opted_in``
    until it replies START. Nothing was written."""

    def __init__(self, at: datetime) -> None:
        super().__init__(at)
        self.at = at


def _written(row: Row) -> Contact | None:
    """The contact a write returned, None if there was none to update;
    PropertyGone if a definition it needed was gone."""
    if row["gone"]:
        raise PropertyGone(min(row["gone"]))
    if row["id"] is None:
        return None
    fields = dict(row)
    del fields["gone"], fields["stop_at"]
    return Contact.from_row(fields)


async def create_contact(conn: Connection, team_id: UUID, new: NewContact) -> Contact:
    """Insert a contact. Raises Duplicate if the team has one with this email,
    PropertyGone if the definition of a key it sets was deleted meanwhile,
    StopStands if it would be ``opted_in`` while its number's STOP stands."""
    args = (
        INSERT_CONTACT, team_id, new.email, new.phone, new.normalized_phone,
        new.phone_country, new.sms_consent_status, new.sms_consent_source, new.first_name,
        new.last_name, new.unsubscribed, json.dumps(new.properties),
        *_definitions(new.properties, new.property_types),
    )
    with unique("email", f"a contact with email {new.email!r} exists already"):
        if new.normalized_phone is None:
            row = await conn.fetchrow(*args)
        else:
            async with conn.transaction():
                await share_consent_lock(conn, team_id)
                row = await conn.fetchrow(*args)
    contact = _written(returned(row))
    if contact is None:
        if row is not None and row["stop_at"] is not None:
            raise StopStands(row["stop_at"])
        raise RuntimeError("the contact was not inserted")
    return contact


def _ref(ref: ContactRef) -> tuple[UUID | None, str | None]:
    return (ref, None) if isinstance(ref, UUID) else (None, ref)


async def get_contact(conn: Connection, team_id: UUID, ref: ContactRef) -> Contact | None:
    row = await conn.fetchrow(SELECT_CONTACT, team_id, *_ref(ref))
    return None if row is None else Contact.from_row(row)


async def find_contact_id(conn: Connection, team_id: UUID, ref: ContactRef) -> UUID | None:
    """The id of the team's contact named by ``ref``, or None."""
    found: UUID | None = await conn.fetchval(TARGET, team_id, *_ref(ref))
    return found


async def lock_contact(conn: Connection, team_id: UUID, ref: ContactRef) -> UUID | None:
    """The id of the team's contact named by ``ref``, or None. In a transaction,
    the contact then stays until it ends (rows can be added for it)."""
    found: UUID | None = await conn.fetchval(LOCK_CONTACT, team_id, *_ref(ref))
    return found


@dataclass(frozen=True)
class ContactFilter:
    email: str | None = None
    segment_id: UUID | None = None
    unsubscribed: bool | None = None
    search: str | None = None


def like_pattern(text: str) -> str:
    """A LIKE pattern matching ``text`` anywhere, with its wildcards taken literally."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


async def list_contacts(
    conn: Connection, team_id: UUID, where: ContactFilter, limit: int, offset: int
) -> list[Contact]:
    """The team's contacts matching every filter given, newest first.

    ``where.segment_id`` must be a segment of the team (the caller checks).
    """
    email = where.email
    search = None if where.search is None else like_pattern(where.search)
    args = [team_id, email, where.unsubscribed, search, limit, offset]
    if where.segment_id is not None:
        rows = await conn.fetch(SELECT_SEGMENT_CONTACTS_FILTERED, *args, where.segment_id)
    elif email is not None:
        rows = await conn.fetch(SELECT_CONTACTS_BY_EMAIL, *args)
    else:
        rows = await conn.fetch(SELECT_CONTACTS, *args)
    return [Contact.from_row(row) for row in rows]


@dataclass(frozen=True)
class ContactChanges:
    """A PATCH. ``given`` names the nullable fields the request set (perhaps to None)."""

    given: frozenset[str]
    email: str | None = None
    phone: str | None = None
    normalized_phone: str | None = None
    phone_country: str | None = None
    first_name: str | None = None
    last_name: str | None = None
    unsubscribed: bool | None = None
    sms_consent_status: str | None = None
    sms_consent_source: str = "api"
    set_properties: dict[str, Json] = field(default_factory=dict)
    remove_properties: list[str] = field(default_factory=list)
    # The type each key of ``set_properties`` was checked as.
    property_types: Mapping[str, PropertyType] = field(default_factory=dict)


class Unreachable(Exception):
    """The change would leave a contact with neither an email nor a phone."""


async def update_contact(
    conn: Connection, team_id: UUID, ref: ContactRef, changes: ContactChanges
) -> Contact | None:
    """Apply a PATCH; None if the team has no such contact.

    Raises Duplicate if the new email is another contact's, Unreachable if
    the contact would be left without an email and a phone, PropertyGone if
    the definition of a key it sets was deleted meanwhile, StopStands if it
    would be ``opted_in`` while its number's STOP stands.
    """
    given = changes.given
    args = (
        UPDATE_CONTACT, team_id, *_ref(ref),
        "email" in given, changes.email,
        "phone" in given, changes.phone, changes.normalized_phone, changes.phone_country,
        "first_name" in given, changes.first_name,
        "last_name" in given, changes.last_name,
        changes.unsubscribed, changes.sms_consent_status, changes.sms_consent_source,
        json.dumps(changes.set_properties), changes.remove_properties,
        *_definitions(changes.set_properties, changes.property_types),
    )
    try:
        with unique("email", f"a contact with email {changes.email!r} exists already"):
            if changes.normalized_phone is None and changes.sms_consent_status is None:
                row = await conn.fetchrow(*args)
            else:
                async with conn.transaction():
                    await share_consent_lock(conn, team_id)
                    row = await conn.fetchrow(*args)
    except asyncpg.CheckViolationError:
        raise Unreachable() from None
    contact = _written(returned(row))
    if contact is None and row is not None and row["stop_at"] is not None:
        if await find_contact_id(conn, team_id, ref) is not None:
            raise StopStands(row["stop_at"])
    return contact


async def delete_contact(conn: Connection, team_id: UUID, ref: ContactRef) -> bool:
    """Delete a contact, its segment memberships and its topic choices."""
    return await conn.fetchval(DELETE_CONTACT, team_id, *_ref(ref)) is not None
