"""The bulk import of contacts: thousands of rows upserted by email in one statement.

Rows whose email the team has are updated, the others inserted, and all of
them added to a segment when one is given. Emails are compared as the unique
index on ``lower(email)`` compares them (see ``tidings.storage.contacts``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from tidings.storage.connection import Connection, returned
from tidings.storage.contact_properties import PropertyType
from tidings.storage.sms_consent import share_consent_lock

# The bulk import, one attempt: rows whose email the team has are updated,
# the others inserted, all of them added to segment $13 (when not NULL). A
# row whose email another transaction inserted after this statement's
# snapshot is neither: the attempt is rolled back and made again (see
# ``import_contacts``). Absent values (NULL) never overwrite stored ones;
# properties are merged key by key.
#
# Locks are taken in one order, whatever the order of the rows, so that two
# imports, or an import and the deletion of a property, never wait for each
# other in a circle: first the definitions of the keys the rows set, as the
# types ($14, $15) they were checked as (KEY SHARE, as every write of
# properties does: see tidings.storage.contacts); then the contacts to update,
# in the order of their ids (as a property's deletion locks them); then the
# new rows, inserted in the order of the unique index (lower(email)). A row
# setting a key whose definition is gone by then is stored nowhere, and
# answered in `gone`, with that key.
IMPORT_CONTACTS = """
WITH input AS MATERIALIZED (
    SELECT row_no, email, phone, normalized_phone, phone_country, first_name, last_name,
           unsubscribed, consent, consent_source, properties::jsonb AS properties
    FROM unnest($2::int[], $3::text[], $4::text[], $5::text[], $6::text[],
                $7::text[], $8::text[], $9::boolean[], $10::text[], $11::text[],
                $12::text[])
        AS i(row_no, email, phone, normalized_phone, phone_country, first_name, last_name,
             unsubscribed, consent, consent_source, properties)
), used AS (
    SELECT DISTINCT jsonb_object_keys(properties) AS key FROM input
), defined AS (
    SELECT key FROM contact_properties
    WHERE team_id = $1 AND key IN (SELECT key FROM used)
      AND (key, type) IN (SELECT * FROM unnest($14::text[], $15::text[]))
    FOR KEY SHARE
), gone AS (
    SELECT coalesce(array_agg(key), '{}') AS keys
    FROM used WHERE key NOT IN (SELECT key FROM defined)
), stops AS MATERIALIZED (
    SELECT address, max(sms_opted_out_at) AS at FROM suppressions
    WHERE team_id = $1 AND sms_opted_out_at IS NOT NULL
    GROUP BY address
), stopped AS (
    SELECT i.row_no, st.at FROM input i JOIN stops st ON st.address = i.normalized_phone
    UNION ALL
    SELECT i.row_no, st.at
    FROM input i
    JOIN contacts c ON c.team_id = $1 AND lower(c.email) = lower(i.email)
    JOIN stops st ON st.address = c.normalized_phone
    WHERE i.normalized_phone IS NULL
), storable AS (
    SELECT i.row_no, i.email, i.phone, i.normalized_phone, i.phone_country, i.first_name,
           i.last_name, i.unsubscribed,
           CASE WHEN st.at IS NOT NULL THEN 'opted_out' ELSE i.consent END AS consent,
           CASE WHEN st.at IS NOT NULL AND i.consent IS DISTINCT FROM 'opted_out'
                THEN 'keyword' ELSE i.consent_source END AS consent_source,
           CASE WHEN st.at IS NOT NULL AND i.consent IS DISTINCT FROM 'opted_out'
                THEN st.at ELSE now() END AS consent_at,
           i.properties
    FROM input i LEFT JOIN stopped st ON st.row_no = i.row_no
    WHERE (i.properties IS NULL OR NOT i.properties ?| (SELECT keys FROM gone))
      AND NOT (st.at IS NOT NULL AND i.consent IS NOT DISTINCT FROM 'opted_in')
), existing AS (
    SELECT c.id AS contact_id, i.*
    FROM contacts c JOIN storable i ON lower(c.email) = lower(i.email)
    WHERE c.team_id = $1
    ORDER BY c.id
    FOR NO KEY UPDATE OF c
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
        sms_consent_updated_at = CASE WHEN i.consent <> c.sms_consent_status THEN i.consent_at
                                      ELSE c.sms_consent_updated_at END,
        sms_consent_source = CASE WHEN i.consent <> c.sms_consent_status THEN i.consent_source
                                  ELSE c.sms_consent_source END,
        properties = CASE WHEN i.properties IS NULL THEN c.properties
                          ELSE c.properties || i.properties END,
        updated_at = now()
    FROM existing i
    WHERE c.id = i.contact_id
    RETURNING c.id, i.row_no
), inserted AS (
    INSERT INTO contacts (team_id, email, phone, normalized_phone, phone_country, first_name,
                          last_name, unsubscribed, sms_consent_status, sms_consent_updated_at,
                          sms_consent_source, properties)
    SELECT $1, i.email, i.phone, i.normalized_phone, i.phone_country, i.first_name,
           i.last_name, COALESCE(i.unsubscribed, false), COALESCE(i.consent, 'unknown'),
           CASE WHEN i.consent IS NULL THEN NULL ELSE i.consent_at END,
           CASE WHEN i.consent IS NULL THEN NULL ELSE i.consent_source END,
           COALESCE(i.properties, '{}'::jsonb)
    FROM storable i
    WHERE NOT EXISTS (
        SELECT 1 FROM contacts c WHERE c.team_id = $1 AND lower(c.email) = lower(i.email)
    )
      -- Only once every update is done: the contacts to update are locked first.
      AND (SELECT count(*) FROM updated) >= 0
    ORDER BY lower(i.email)
    ON CONFLICT (team_id, lower(email)) WHERE email IS NOT NULL DO NOTHING
    RETURNING id, lower(email) AS email_key
), members AS (
    INSERT INTO segment_contacts (segment_id, contact_id)
    SELECT $13::uuid, touched.id
    FROM (SELECT id FROM updated UNION ALL SELECT id FROM inserted) AS touched
    WHERE $13::uuid IS NOT NULL
    ON CONFLICT DO NOTHING
    RETURNING contact_id
), refused AS (
    SELECT row_no, (SELECT min(k) FROM jsonb_object_keys(properties) AS k
                    WHERE k NOT IN (SELECT key FROM defined)) AS key
    FROM input
    WHERE properties ?| (SELECT keys FROM gone)
)
SELECT ARRAY(SELECT i.row_no FROM inserted JOIN input i ON lower(i.email) = inserted.email_key)
           AS inserted,
       ARRAY(SELECT row_no FROM updated) AS updated,
       (SELECT count(*) FROM members) AS added,
       ARRAY(SELECT row_no FROM refused ORDER BY row_no) AS gone_rows,
       ARRAY(SELECT key FROM refused ORDER BY row_no) AS gone_keys,
       ARRAY(SELECT i.row_no FROM input i JOIN stopped st ON st.row_no = i.row_no
             WHERE i.consent = 'opted_in' ORDER BY i.row_no) AS stopped_rows,
       ARRAY(SELECT st.at FROM input i JOIN stopped st ON st.row_no = i.row_no
             WHERE i.consent = 'opted_in' ORDER BY i.row_no) AS stopped_at
"""

# Each email as the unique index compares it, in the order given.
EMAIL_KEYS = """
SELECT ARRAY(SELECT lower(e.email) FROM unnest($1::text[]) WITH ORDINALITY AS e(email, n)
             ORDER BY e.n)
"""

# A row whose email keeps being inserted by others between attempts is given
# up after this many attempts and reported back to the caller.
IMPORT_ATTEMPTS = 3


class _Contended(Exception):
    """Rows met emails inserted meanwhile: the attempt is rolled back."""


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
    # Rows not stored because the definition of a key they set was deleted
    # meanwhile: the row's number and that key.
    gone: dict[int, str]
    # Rows not stored because they opt in a number whose STOP stands: the
    # row's number and when the number replied STOP.
    stopped: dict[int, datetime]


async def import_contacts(
    conn: Connection,
    team_id: UUID,
    rows: list[ImportRow],
    segment_id: UUID | None,
    checked_as: Mapping[str, PropertyType],
) -> ImportResult:
    """Upsert ``rows`` by email and add them to ``segment_id``: set-based, one
    statement per attempt (normally one attempt).

    Emails must be unique within ``rows`` as ``email_keys`` folds them, and the
    segment the team's. ``checked_as`` are the definitions the rows'
    properties were checked against: a row with a key no longer defined so
    is left out, and answered in ``gone``. Run it in a transaction, which
    keeps those definitions until it ends: cancelled or failing, it leaves nothing.
    """
    if not rows:
        return ImportResult(0, 0, 0, [], {}, {})
    if any(r.normalized_phone for r in rows):
        # As a contact write does: a STOP in flight for one of the numbers is
        # waited for, and the statement below (its snapshot taken after)
        # sees it. Held until the import's transaction ends: a STOP for the
        # team waits for the import.
        await share_consent_lock(conn, team_id)
    # An attempt that meets emails inserted since its snapshot is rolled
    # back (to a savepoint) and made again whole, rather than finished by a
    # second statement for those rows: that one would lock them, as contacts
    # to update, after the rows the first inserted, and so wait in a circle
    # with an import that locked them first and then waits for one of those
    # rows. Each attempt locks its updates before its inserts.
    for attempt in range(1, IMPORT_ATTEMPTS + 1):
        try:
            async with conn.transaction():
                result = await _attempt(conn, team_id, rows, segment_id, checked_as)
                if result.contended and attempt < IMPORT_ATTEMPTS:
                    raise _Contended
                return result
        except _Contended:
            pass
    raise AssertionError("the last attempt returns")


async def _attempt(
    conn: Connection,
    team_id: UUID,
    rows: list[ImportRow],
    segment_id: UUID | None,
    checked_as: Mapping[str, PropertyType],
) -> ImportResult:
    """One statement over every row; the rows it could neither insert nor
    update are ``contended``."""
    # A statement of its own, not the connection's cached one: PostgreSQL
    # plans a fresh statement for the rows it is given, where a cached one
    # would soon get a generic plan, made for arrays of unknown length and
    # badly wrong for 50,000 rows. (plan_cache_mode would do it too, but it
    # would also replan each of the foreign key checks, one per row.)
    statement = await conn.prepare(IMPORT_CONTACTS)
    record = returned(await statement.fetchrow(
        team_id,
        [r.row for r in rows],
        [r.email for r in rows],
        [r.phone for r in rows],
        [r.normalized_phone for r in rows],
        [r.phone_country for r in rows],
        [r.first_name for r in rows],
        [r.last_name for r in rows],
        [r.unsubscribed for r in rows],
        [r.sms_consent_status for r in rows],
        [r.sms_consent_source for r in rows],
        [r.properties for r in rows],
        segment_id,
        list(checked_as),
        list(checked_as.values()),
    ))
    inserted, updated = set(record["inserted"]), set(record["updated"])
    gone = dict(zip(record["gone_rows"], record["gone_keys"], strict=True))
    stopped = dict(zip(record["stopped_rows"], record["stopped_at"], strict=True))
    done = inserted | updated | gone.keys() | stopped.keys()
    return ImportResult(
        created=len(inserted), updated=len(updated), added_to_segment=record["added"],
        contended=[r.row for r in rows if r.row not in done], gone=gone, stopped=stopped,
    )
