"""Suppressed addresses: email addresses and phone numbers a team must not send to.

Addresses are stored normalised, emails in lowercase and phone numbers in
E.164, and are unique per team. An email is lowercased by PostgreSQL's
``lower()`` and only by it, wherever it is stored or compared: Python's
``str.lower`` folds some letters otherwise (``İ``), and a suppression must
catch every spelling of the mailbox.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal
from uuid import UUID

from tidings.storage.connection import Connection, Row, returned
from tidings.storage.errors import unique
from tidings.storage.sms_consent import SOURCE, hold_consent_lock

Reason = Literal["bounce", "complaint", "unsubscribe", "manual", "sms_opt_out"]
REASONS: tuple[str, ...] = ("bounce", "complaint", "unsubscribe", "manual", "sms_opt_out")
Kind = Literal["email", "phone"]

COLUMNS = "id, team_id, address, kind, reason, source_message_id, created_at, sms_opted_out_at"

# A phone suppressed for the reason ``sms_opt_out`` records a STOP, as the
# number's own reply does (an opt-out list brought from elsewhere): only a
# START from the number lifts it, and the team's contacts with the number
# are opted out as by the reply (``tidings.storage.sms_consent``): source
# ``keyword``, stamped when the STOP was recorded, as a contact given the
# number later is.
INSERT_SUPPRESSION = f"""
WITH inserted AS (
    INSERT INTO suppressions
        (team_id, address, kind, reason, source_message_id, sms_opted_out_at)
    VALUES ($1, CASE WHEN $3::text = 'email' THEN lower($2) ELSE $2 END, $3, $4, $5,
            CASE WHEN $3::text = 'phone' AND $4::text = 'sms_opt_out' THEN now() END)
    RETURNING {COLUMNS}
), stopped AS (
    UPDATE contacts c SET sms_consent_status = 'opted_out', sms_consent_source = $6,
                          sms_consent_updated_at = i.sms_opted_out_at, updated_at = now()
    FROM inserted i
    WHERE i.sms_opted_out_at IS NOT NULL AND c.team_id = i.team_id
      AND c.normalized_phone = i.address AND c.sms_consent_status <> 'opted_out'
)
SELECT {COLUMNS} FROM inserted
"""

# An opt-out for a number suppressed already for another reason records the
# STOP on that suppression, and does what a STOP does: $1 team, $2 number.
STAMP_STOP = f"""
WITH stamped AS (
    UPDATE suppressions SET sms_opted_out_at = now()
    WHERE team_id = $1 AND address = $2 AND sms_opted_out_at IS NULL
    RETURNING {COLUMNS}
), stopped AS (
    UPDATE contacts c SET sms_consent_status = 'opted_out', sms_consent_source = $3,
                          sms_consent_updated_at = s.sms_opted_out_at, updated_at = now()
    FROM stamped s
    WHERE c.team_id = s.team_id AND c.normalized_phone = s.address
      AND c.sms_consent_status <> 'opted_out'
)
SELECT {COLUMNS} FROM stamped
"""

SELECT_SUPPRESSION = f"SELECT {COLUMNS} FROM suppressions WHERE team_id = $1 AND id = $2"

# $2 reason, $3 search (a LIKE pattern); NULL means no filter.
SELECT_SUPPRESSIONS = f"""
SELECT {COLUMNS} FROM suppressions
WHERE team_id = $1
  AND ($2::text IS NULL OR reason = $2)
  AND ($3::text IS NULL OR address ILIKE $3)
ORDER BY created_at DESC, id DESC
LIMIT $4 OFFSET $5
"""

# A suppression that records a STOP (``sms_opted_out_at``) stays.
DELETE_SUPPRESSION = """
WITH target AS (
    SELECT id, sms_opted_out_at FROM suppressions WHERE team_id = $1 AND id = $2 FOR UPDATE
), deleted AS (
    DELETE FROM suppressions s USING target
    WHERE s.id = target.id AND target.sms_opted_out_at IS NULL
)
SELECT EXISTS (SELECT 1 FROM target) AS found, (SELECT sms_opted_out_at FROM target) AS stop_at
"""

# Many addresses of many teams at once; an address suppressed already stays as it was.
SUPPRESS_MANY = """
INSERT INTO suppressions (team_id, address, kind, reason, source_message_id)
SELECT team_id, lower(address), 'email', reason, message_id
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::uuid[])
     AS i(team_id, address, reason, message_id)
ON CONFLICT (team_id, address) DO NOTHING
"""

# Those of the addresses ($2, as given) the team suppresses: emails folded by lower().
SUPPRESSED = """
SELECT a AS address FROM unnest($2::text[]) a
WHERE EXISTS (SELECT 1 FROM suppressions s WHERE s.team_id = $1
              AND s.address = CASE WHEN position('@' IN a) > 0 THEN lower(a) ELSE a END)
"""


@dataclass(frozen=True)
class Suppression:
    id: UUID
    team_id: UUID
    address: str
    kind: Kind
    reason: Reason
    source_message_id: UUID | None
    created_at: datetime
    # When the number replied STOP (or was suppressed as having), while that stands.
    sms_opted_out_at: datetime | None = None


MESSAGE_OF_TEAM = """
SELECT EXISTS (SELECT 1 FROM emails WHERE team_id = $1 AND id = $2)
    OR EXISTS (SELECT 1 FROM sms_messages WHERE team_id = $1 AND id = $2)
"""


async def is_message_of(conn: Connection, team_id: UUID, message_id: UUID) -> bool:
    """Whether ``message_id`` is an email or SMS message of the team."""
    found: bool = await conn.fetchval(MESSAGE_OF_TEAM, team_id, message_id)
    return found


async def create_suppression(
    conn: Connection,
    team_id: UUID,
    address: str,
    kind: Kind,
    reason: Reason,
    source_message_id: UUID | None,
) -> tuple[Suppression, bool]:
    """Suppress a normalised address; the suppression, and whether it is
    new. Raises Duplicate if the team suppresses it already.

    A phone suppressed with the reason ``sms_opt_out`` is a STOP: it holds
    the team's consent lock alone, as a keyword does, so that a contact
    write in flight that gives the number is waited for and opted out too,
    and one that comes after finds the STOP. A number suppressed already
    for another reason gets the STOP recorded on that suppression (not
    new), as a keyword would; one whose STOP is recorded already is a
    Duplicate."""
    args = (team_id, address, kind, reason, source_message_id, SOURCE)
    row: Row | None
    with unique("address", f"{address!r} is suppressed already"):
        if kind == "phone" and reason == "sms_opt_out":
            async with conn.transaction():
                await hold_consent_lock(conn, [team_id])
                stamped = await conn.fetchrow(STAMP_STOP, team_id, address, SOURCE)
                if stamped is not None:
                    return Suppression(**dict(stamped)), False
                row = await conn.fetchrow(INSERT_SUPPRESSION, *args)
        else:
            row = await conn.fetchrow(INSERT_SUPPRESSION, *args)
    return Suppression(**dict(returned(row))), True


async def get_suppression(
    conn: Connection, team_id: UUID, suppression_id: UUID
) -> Suppression | None:
    row = await conn.fetchrow(SELECT_SUPPRESSION, team_id, suppression_id)
    return None if row is None else Suppression(**dict(row))


async def list_suppressions(
    conn: Connection,
    team_id: UUID,
    reason: str | None,
    search: str | None,
    limit: int,
    offset: int,
) -> list[Suppression]:
    """Newest first; ``search`` is a LIKE pattern matched case-insensitively."""
    rows = await conn.fetch(SELECT_SUPPRESSIONS, team_id, reason, search, limit, offset)
    return [Suppression(**dict(row)) for row in rows]


class OptedOut(Exception):
    """The suppression records a STOP from the number: only its START lifts it."""

    def __init__(self, at: datetime) -> None:
        super().__init__(at)
        self.at = at


async def delete_suppression(conn: Connection, team_id: UUID, suppression_id: UUID) -> bool:
    """Lift the suppression; False if the team has none by that id. Raises
    ``OptedOut`` for a number whose STOP it records."""
    row = returned(await conn.fetchrow(DELETE_SUPPRESSION, team_id, suppression_id))
    if row["stop_at"] is not None:
        raise OptedOut(row["stop_at"])
    return bool(row["found"])


async def suppressed(conn: Connection, team_id: UUID, addresses: Iterable[str]) -> set[str]:
    """Those of ``addresses`` the team must not send to, as given: one query
    for all of them.

    Emails match case-insensitively; phone numbers must be in E.164 (as a
    contact's ``normalized_phone`` is).
    """
    given = {address.strip(): address for address in addresses}
    if not given:
        return set()
    rows = await conn.fetch(SUPPRESSED, team_id, list(given))
    return {given[row["address"]] for row in rows}


async def suppress_emails(
    conn: Connection, entries: Iterable[tuple[UUID, str, Reason, UUID | None]]
) -> None:
    """Suppress email addresses, each ``(team_id, address, reason, source_message_id)``,
    in one statement; addresses a team suppresses already are left as they are."""
    rows = list(entries)
    if rows:
        await conn.execute(
            SUPPRESS_MANY,
            [row[0] for row in rows],
            [row[1] for row in rows],
            [row[2] for row in rows],
            [row[3] for row in rows],
        )
