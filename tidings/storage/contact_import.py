"""The bulk import of contacts: thousands of rows upserted by email in one statement.

Rows whose email the team has are updated, the others inserted, and all of
them added to a segment when one is given. Emails are compared as the unique
index on ``lower(email)`` compares them (see ``tidings.storage.contacts``).
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from tidings.storage.connection import Connection, returned

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


async def email_keys(conn: Connection, emails: list[str]) -> list[str]:
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
    conn: Connection, team_id: UUID, rows: list[ImportRow], segment_id: UUID | None
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
        record = returned(await statement.fetchrow(
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
        ))
        inserted_rows = set(record["inserted"])
        updated_rows = set(record["updated"])
        created += len(inserted_rows)
        updated += len(updated_rows)
        added += record["added"]
        done = inserted_rows | updated_rows
        pending = [r for r in pending if r.row not in done]
    return ImportResult(created, updated, added, [r.row for r in pending])
