"""SMS consent of a phone number, one model for every channel that asks.

Opting out (a STOP reply) suppresses the number for the team, as a phone
suppression with reason ``sms_opt_out`` (so that it holds even when no
contact has the number yet), and marks every contact of the team with that
number ``opted_out`` with source ``keyword``. A number suppressed already
(by hand, say) keeps its suppression, which records the STOP
(``sms_opted_out_at``): lifting it is refused while the STOP stands, so
the number is never texted again without a START. A phone suppressed
through the API with the reason ``sms_opt_out`` (an opt-out list brought
from elsewhere) is a STOP too, and does the same to the team's contacts
(``tidings.storage.suppressions``). Opting back in (START)
lifts the ``sms_opt_out`` suppression, clears the STOP of any other (a
manual suppression stays), and marks the contacts ``opted_in``. Sending to
an opted-out number is refused (``tidings.storage.sms``).

A keyword and a contact write that gives a number or a consent status meet
on the team's consent lock (an advisory lock per team, held until the
transaction ends): the keyword takes it alone, the writes share it. Each
side reads the other with a snapshot taken after it holds the lock, so
whichever comes second sees what the first committed: a STOP marks the
number's contacts, those a write in flight gave the number included, and a
write after a STOP finds it (``STOP``, used by ``tidings.storage.contacts``).
Checking and writing in one statement is not enough: a statement's snapshot
is taken before it waits, so it would write over a STOP it waited for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from uuid import UUID

from tidings.storage.connection import Connection, returned

SOURCE = "keyword"
APPLIED = """
INSERT INTO sms_replies_applied (message_sid) VALUES ($1)
ON CONFLICT (message_sid) DO NOTHING RETURNING true
"""

# "stop" in ASCII: the class of the teams' consent locks (two-key advisory
# locks, apart from the one-key migration lock); the second key is the team's.
CONSENT_LOCK = 0x73746F70

# The keywords' side: every team named, in one order, so two never deadlock.
HOLD_TEAMS = f"""
SELECT count(pg_advisory_xact_lock({CONSENT_LOCK}, key)) FROM (
    SELECT DISTINCT hashtext(team_id::text) AS key FROM unnest($1::uuid[]) AS t(team_id)
    ORDER BY key
) AS keys
"""

# The contact writes' side: shared among them.
SHARE_TEAM = f"SELECT pg_advisory_xact_lock_shared({CONSENT_LOCK}, hashtext($1::uuid::text))"

# The STOP that stands for a number (a CTE of a statement whose $1 is the
# team): its suppression's ``sms_opted_out_at``, NULL for none.
STOP = """
stop AS (
    SELECT max(sms_opted_out_at) AS at FROM suppressions
    WHERE team_id = $1 AND sms_opted_out_at IS NOT NULL AND address = {phone}
)"""

# What a provider answers when it refuses a number that opted out with it
# (a STOP sent before the account used Tidings, or to another of its
# numbers): Twilio's 21610, "Attempt to send to unsubscribed recipient". Its
# refusal is recorded as that number's STOP.
PROVIDER_OPT_OUTS = frozenset({("twilio", "21610")})

OPT_OUT = """
WITH suppressed AS (
    INSERT INTO suppressions AS s
        (team_id, address, kind, reason, source_message_id, sms_opted_out_at)
    SELECT team_id, $2, 'phone', 'sms_opt_out', $3, now() FROM unnest($1::uuid[]) AS t(team_id)
    ON CONFLICT (team_id, address) DO UPDATE SET sms_opted_out_at = now()
        WHERE s.sms_opted_out_at IS NULL
    RETURNING id
), changed AS (
    UPDATE contacts SET sms_consent_status = 'opted_out', sms_consent_source = $4,
                        sms_consent_updated_at = now(), updated_at = now()
    WHERE team_id = ANY($1::uuid[]) AND normalized_phone = $2
      AND sms_consent_status <> 'opted_out'
    RETURNING id
)
SELECT (SELECT count(*) FROM suppressed) AS suppressions, (SELECT count(*) FROM changed) AS contacts
"""

OPT_IN = """
WITH lifted AS (
    DELETE FROM suppressions
    WHERE team_id = ANY($1::uuid[]) AND address = $2 AND reason = 'sms_opt_out'
    RETURNING id
), cleared AS (
    UPDATE suppressions SET sms_opted_out_at = NULL
    WHERE team_id = ANY($1::uuid[]) AND address = $2 AND reason <> 'sms_opt_out'
      AND sms_opted_out_at IS NOT NULL
), changed AS (
    UPDATE contacts SET sms_consent_status = 'opted_in', sms_consent_source = $3,
                        sms_consent_updated_at = now(), updated_at = now()
    WHERE team_id = ANY($1::uuid[]) AND normalized_phone = $2
      AND sms_consent_status <> 'opted_in'
    RETURNING id
)
SELECT (SELECT count(*) FROM lifted) AS suppressions, (SELECT count(*) FROM changed) AS contacts
"""

TEAM_NAMES = "SELECT id, name FROM teams WHERE id = ANY($1::uuid[])"


@dataclass(frozen=True)
class ConsentChange:
    """What an opt-out or opt-in changed: suppressions added or lifted, contacts marked."""

    suppressions: int
    contacts: int


async def hold_consent_lock(conn: Connection, team_ids: Sequence[UUID]) -> None:
    """In a transaction: hold the teams' consent locks alone until it ends,
    as a keyword does. Contact writes in flight are waited for, and the next
    statement sees them."""
    await conn.execute(HOLD_TEAMS, list(team_ids))


async def opt_out(
    conn: Connection, team_ids: Sequence[UUID], phone: str, source_message_id: UUID | None,
    *, reply: str | None = None,
) -> ConsentChange:
    """The teams must not text ``phone`` (E.164) any more. ``reply``: the
    provider's id of the reply that asked, applied once (see ``first_time``)."""
    async with conn.transaction():
        await hold_consent_lock(conn, team_ids)
        if not await first_time(conn, reply):
            return ConsentChange(0, 0)
        row = returned(
            await conn.fetchrow(OPT_OUT, list(team_ids), phone, source_message_id, SOURCE)
        )
    return ConsentChange(row["suppressions"], row["contacts"])


async def opt_in(
    conn: Connection, team_ids: Sequence[UUID], phone: str, *, reply: str | None = None
) -> ConsentChange:
    """``phone`` asked the teams to text it again (``reply`` as for ``opt_out``)."""
    async with conn.transaction():
        await hold_consent_lock(conn, team_ids)
        if not await first_time(conn, reply):
            return ConsentChange(0, 0)
        row = returned(await conn.fetchrow(OPT_IN, list(team_ids), phone, SOURCE))
    return ConsentChange(row["suppressions"], row["contacts"])


async def first_time(conn: Connection, reply: str | None) -> bool:
    """In the keyword's transaction: whether the reply with this id is applied
    for the first time (marked so, with the change it makes). A request sent
    again, or replayed, changes consent once."""
    if reply is None:
        return True
    return bool(await conn.fetchval(APPLIED, reply))


async def share_consent_lock(conn: Connection, team_id: UUID) -> None:
    """In a transaction: hold the team's consent lock, shared, until it ends.
    A keyword in flight is waited for, and the next statement sees it."""
    await conn.execute(SHARE_TEAM, team_id)


async def team_names(conn: Connection, team_ids: Sequence[UUID]) -> dict[UUID, str]:
    return {row["id"]: row["name"] for row in await conn.fetch(TEAM_NAMES, list(team_ids))}
