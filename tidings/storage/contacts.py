"""Contacts of a team: one at a time, listed with filters, and imported in bulk.

A contact is named by its id or by its email (case-insensitively); a
``ContactRef`` is either. Emails are unique per team, case-insensitively.

Case is folded by PostgreSQL's ``lower()`` alone, as the unique index on
``lower(email)`` does it, never by Python's ``str.lower``: the two differ
(``İ``, U+0130, is ``i`` for one and ``i`` + U+0307 for the other).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg

from tidings.storage.errors import unique

CONTACT_COLUMNS = """
id, team_id, email, phone, normalized_phone, phone_country, sms_consent_status,
sms_consent_updated_at, sms_consent_source, first_name, last_name, unsubscribed,
properties, created_at, updated_at
"""

INSERT_CONTACT = f"""
INSERT INTO contacts (team_id, email, phone, normalized_phone, phone_country,
                      sms_consent_status, sms_consent_updated_at, sms_consent_source,
                      first_name, last_name, unsubscribed, properties)
VALUES ($1, $2, $3, $4, $5, $6,
        CASE WHEN $6 = 'unknown' THEN NULL ELSE now() END,
        CASE WHEN $6 = 'unknown' THEN NULL ELSE $7 END,
        $8, $9, $10, $11::jsonb)
RETURNING {CONTACT_COLUMNS}
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
# when the status does.
UPDATE_CONTACT = f"""
UPDATE contacts SET
    email = CASE WHEN $4 THEN $5 ELSE email END,
    phone = CASE WHEN $6 THEN $7 ELSE phone END,
    normalized_phone = CASE WHEN $6 THEN $8 ELSE normalized_phone END,
    phone_country = CASE WHEN $6 THEN $9 ELSE phone_country END,
    first_name = CASE WHEN $10 THEN $11 ELSE first_name END,
    last_name = CASE WHEN $12 THEN $13 ELSE last_name END,
    unsubscribed = COALESCE($14, unsubscribed),
    sms_consent_status = COALESCE($15, sms_consent_status),
    sms_consent_updated_at = CASE WHEN $15 <> sms_consent_status THEN now()
                                  ELSE sms_consent_updated_at END,
    sms_consent_source = CASE WHEN $15 <> sms_consent_status THEN $16
                              ELSE sms_consent_source END,
    properties = (properties || $17::jsonb) - $18::text[],
    updated_at = now()
WHERE team_id = $1 AND id = ({TARGET})
RETURNING {CONTACT_COLUMNS}
"""

# KEY SHARE: the contact cannot be deleted (nor its id change) before the
# transaction ends, so that rows added for it keep their foreign key.
LOCK_CONTACT = f"""
SELECT id FROM contacts WHERE team_id = $1 AND id = ({TARGET}) FOR KEY SHARE
"""

DELETE_CONTACT = f"""
DELETE FROM contacts WHERE team_id = $1 AND id = ({TARGET}) RETURNING id
"""

# The bulk import, one pass: rows whose email the team has are updated, the
# others inserted, all of them added to segment $13 (when not NULL). A row
# whose email another transaction inserted after this statement's snapshot
# is neither, and is left for the next pass. Absent values
# (NULL) never overwrite stored ones; properties are merged key by key.
IMPORT_CONTACTS = """
WITH input AS (
    SELECT * FROM unnest($2::int[], $3::text[], $4::text[], $5::text[], $6::text[],
                         $7::text[], $8::text[], $9::boolean[], $10::text[], $11::text[],
                         $12::text[])
        AS i(row_no, email, phone, normalized_phone, phone_country, first_name, last_name,
             unsubscribed, consent, consent_source, properties)
), updated AS (
    UPDATE contacts c SET
        phone = COALESCE(i.phone, c.phone),
        normalized_phone = CASE WHEN i.phone IS NULL THEN c.normalized_phone
                                ELSE i.normalized_phone END,
        phone_country = CASE WHEN i.phone IS NULL THEN c.phone_country
                             ELSE i.phone_country END,
        first_name = COALESCE(i.first_name, c.first_name),
        last_name = COALESCE(i.last_name, c.last_name),
        unsubscribed = COALESCE(i.unsubscribed, c.unsubscribed),
        sms_consent_status = COALESCE(i.consent, c.sms_consent_status),
        sms_consent_updated_at = CASE WHEN i.consent <> c.sms_consent_status THEN now()
                                      ELSE c.sms_consent_updated_at END,
        sms_consent_source = CASE WHEN i.consent <> c.sms_consent_status THEN i.consent_source
                                  ELSE c.sms_consent_source END,
        properties = CASE WHEN i.properties IS NULL THEN c.properties
                          ELSE c.properties || i.properties::jsonb END,
        updated_at = now()
    FROM input i
    WHERE c.team_id = $1 AND lower(c.email) = lower(i.email)
    RETURNING c.id, i.row_no
), inserted AS (
    INSERT INTO contacts (team_id, email, phone, normalized_phone, phone_country, first_name,
                          last_name, unsubscribed, sms_consent_status, sms_consent_updated_at,
                          sms_consent_source, properties)
    SELECT $1, i.email, i.phone, i.normalized_phone, i.phone_country, i.first_name,
           i.last_name, COALESCE(i.unsubscribed, false), COALESCE(i.consent, 'unknown'),
           CASE WHEN i.consent IS NULL THEN NULL ELSE now() END,
           CASE WHEN i.consent IS NULL THEN NULL ELSE i.consent_source END,
           COALESCE(i.properties::jsonb, '{}'::jsonb)
    FROM input i
    WHERE NOT EXISTS (
        SELECT 1 FROM contacts c WHERE c.team_id = $1 AND lower(c.email) = lower(i.email)
    )
    ON CONFLICT (team_id, lower(email)) WHERE email IS NOT NULL DO NOTHING
    RETURNING id, lower(email) AS email_key
), members AS (
    INSERT INTO segment_contacts (segment_id, contact_id)
    SELECT $13::uuid, touched.id
    FROM (SELECT id FROM updated UNION ALL SELECT id FROM inserted) AS touched
    WHERE $13::uuid IS NOT NULL
    ON CONFLICT DO NOTHING
    RETURNING contact_id
)
SELECT ARRAY(SELECT i.row_no FROM inserted JOIN input i ON lower(i.email) = inserted.email_key)
           AS inserted,
       ARRAY(SELECT row_no FROM updated) AS updated,
       (SELECT count(*) FROM members) AS added
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
    properties: dict[str, Any]
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: Any) -> Contact:
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
    properties: dict[str, Any]


async def create_contact(conn: Any, team_id: UUID, new: NewContact) -> Contact:
    """Insert a contact. Raises Duplicate if the team has one with this email."""
    with unique("email", f"a contact with email {new.email!r} exists already"):
        row = await conn.fetchrow(
            INSERT_CONTACT,
            team_id,
            new.email,
            new.phone,
            new.normalized_phone,
            new.phone_country,
            new.sms_consent_status,
            new.sms_consent_source,
            new.first_name,
            new.last_name,
            new.unsubscribed,
            json.dumps(new.properties),
        )
    return Contact.from_row(row)


def _ref(ref: ContactRef) -> tuple[UUID | None, str | None]:
    return (ref, None) if isinstance(ref, UUID) else (None, ref)


async def get_contact(conn: Any, team_id: UUID, ref: ContactRef) -> Contact | None:
    row = await conn.fetchrow(SELECT_CONTACT, team_id, *_ref(ref))
    return None if row is None else Contact.from_row(row)


async def find_contact_id(conn: Any, team_id: UUID, ref: ContactRef) -> UUID | None:
    """The id of the team's contact named by ``ref``, or None."""
    found: UUID | None = await conn.fetchval(TARGET, team_id, *_ref(ref))
    return found


async def lock_contact(conn: Any, team_id: UUID, ref: ContactRef) -> UUID | None:
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
    conn: Any, team_id: UUID, where: ContactFilter, limit: int, offset: int
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
    set_properties: dict[str, Any] = field(default_factory=dict)
    remove_properties: list[str] = field(default_factory=list)


class Unreachable(Exception):
    """The change would leave a contact with neither an email nor a phone."""


async def update_contact(
    conn: Any, team_id: UUID, ref: ContactRef, changes: ContactChanges
) -> Contact | None:
    """Apply a PATCH; None if the team has no such contact.

    Raises Duplicate if the new email is another contact's, Unreachable if
    the contact would be left without an email and a phone.
    """
    given = changes.given
    try:
        with unique("email", f"a contact with email {changes.email!r} exists already"):
            row = await conn.fetchrow(
                UPDATE_CONTACT,
                team_id,
                *_ref(ref),
                "email" in given, changes.email,
                "phone" in given, changes.phone, changes.normalized_phone, changes.phone_country,
                "first_name" in given, changes.first_name,
                "last_name" in given, changes.last_name,
                changes.unsubscribed,
                changes.sms_consent_status,
                changes.sms_consent_source,
                json.dumps(changes.set_properties),
                changes.remove_properties,
            )
    except asyncpg.CheckViolationError:
        raise Unreachable() from None
    return None if row is None else Contact.from_row(row)


async def delete_contact(conn: Any, team_id: UUID, ref: ContactRef) -> bool:
    """Delete a contact, its segment memberships and its topic choices."""
    return await conn.fetchval(DELETE_CONTACT, team_id, *_ref(ref)) is not None


# --- bulk import ------------------------------------------------------------------

# Each email as the unique index compares it, in the order given.
EMAIL_KEYS = """
SELECT ARRAY(SELECT lower(e.email) FROM unnest($1::text[]) WITH ORDINALITY AS e(email, n)
             ORDER BY e.n)
"""

# A row whose email keeps being inserted by others between passes is given up
# after this many passes and reported back to the caller.
IMPORT_PASSES = 3


@dataclass(slots=True)
class ImportRow:
    """One checked row. None means "not given": it never overwrites a stored value.
    ``properties`` is a JSON object text or None."""

    row: int
    email: str
    phone: str | None
    normalized_phone: str | None
    phone_country: str | None
    first_name: str | None
    last_name: str | None
    unsubscribed: bool | None
    sms_consent_status: str | None
    sms_consent_source: str
    properties: str | None


async def email_keys(conn: Any, emails: list[str]) -> list[str]:
    """``emails`` folded to lowercase by PostgreSQL, as the unique index on a
    contact's email folds them: two emails with the same key are one contact."""
    if not emails:
        return []
    keys: list[str] = await conn.fetchval(EMAIL_KEYS, emails)
    return keys


@dataclass(frozen=True)
class ImportResult:
    created: int
    updated: int
    added_to_segment: int
    # Rows that other transactions kept changing under this import.
    contended: list[int]


async def import_contacts(
    conn: Any, team_id: UUID, rows: list[ImportRow], segment_id: UUID | None
) -> ImportResult:
    """Upsert ``rows`` by email and add them to ``segment_id``: set-based, one
    statement per pass (normally one pass).

    Emails must be unique within ``rows`` as ``email_keys`` folds them, and the
    segment the team's. Run it in a transaction: cancelled or failing, it leaves nothing.
    """
    created = updated = added = 0
    pending = rows
    if not pending:
        return ImportResult(0, 0, 0, [])
    # A statement of its own, not the connection's cached one: PostgreSQL
    # plans a fresh statement for the rows it is given, where a cached one
    # would soon get a generic plan, made for arrays of unknown length and
    # badly wrong for 50,000 rows. (plan_cache_mode would do it too, but it
    # would also replan each of the foreign key checks, one per row.)
    statement = await conn.prepare(IMPORT_CONTACTS)
    for _ in range(IMPORT_PASSES):
        if not pending:
            break
        record = await statement.fetchrow(
            team_id,
            [r.row for r in pending],
            [r.email for r in pending],
            [r.phone for r in pending],
            [r.normalized_phone for r in pending],
            [r.phone_country for r in pending],
            [r.first_name for r in pending],
            [r.last_name for r in pending],
            [r.unsubscribed for r in pending],
            [r.sms_consent_status for r in pending],
            [r.sms_consent_source for r in pending],
            [r.properties for r in pending],
            segment_id,
        )
        inserted_rows = set(record["inserted"])
        updated_rows = set(record["updated"])
        created += len(inserted_rows)
        updated += len(updated_rows)
        added += record["added"]
        done = inserted_rows | updated_rows
        pending = [r for r in pending if r.row not in done]
    return ImportResult(created, updated, added, [r.row for r in pending])
