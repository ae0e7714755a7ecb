"""What the send workers' frequent statements read does not grow with the tables.

A dispatcher polls for owners with due work every second, and every batch
of outcomes (the sandbox's, a relay's reports) checks what each email has
recorded already. Both are counted here in rows read, from PostgreSQL's
own per-transaction statistics (``pg_stat_xact_user_tables``), on tables
far larger than what the statement is about.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID, uuid4

import pytest

from tidings.config import Config
from tidings.storage import tokens as token_store
from tidings.storage.db import Database, open_database
from tidings.storage.email_outcomes import Outcome, record_outcomes, sent_email
from tidings.storage.emails_sending import LEASES as EMAIL_LEASES
from tidings.storage.emails_sending import TAKE_FOLLOWUPS
from tidings.storage.leases import claim_rows, owners_of
from tidings.storage.sms_sending import LEASES as SMS_LEASES

READ = """
SELECT coalesce(seq_scan, 0) AS seq_scan,
       coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) AS rows
FROM pg_stat_xact_user_tables WHERE relname = $1
"""

INDEX_READ = "SELECT pg_stat_get_xact_tuples_returned($1::regclass) AS entries"

# $1 team, $2 how many, $3 due in (seconds; NULL: nothing left to send), $4 leased for.
EMAILS = """
INSERT INTO emails (id, team_id, from_address, from_email, to_addresses, to_lookup, send_to,
                    subject, status, domain, smtp_message_id, next_attempt_at, leased_until)
SELECT id, $1, 'a@acme.example', 'a@acme.example', ARRAY['r' || n || '@x.example'],
       ARRAY['r' || n || '@x.example'], ARRAY['r' || n || '@x.example'], 'hi', 'queued',
       'acme.example', '<' || id || '@acme.example>',
       now() + $3 * interval '1 second', now() + $4 * interval '1 second'
FROM (SELECT gen_random_uuid() AS id, n FROM generate_series(1, $2) n) g
RETURNING id, to_addresses[1] AS recipient
"""


@pytest.fixture
async def db(config: Config) -> AsyncIterator[Database]:
    async with open_database(config) as database:
        yield database


async def team(db: Database, name: str) -> UUID:
    async with db.transaction() as conn:
        return await token_store.ensure_team(conn, name)


async def emails(
    db: Database, team_id: UUID, count: int, due_in: float | None, leased_for: float | None = None
) -> list[Any]:
    async with db.transaction() as conn:
        return list(await conn.fetch(EMAILS, team_id, count, due_in, leased_for))


async def test_a_poll_reads_a_row_per_team_not_per_due_email(db: Database) -> None:
    crowded, quiet, later, busy, done = [await team(db, name) for name in "abcde"]
    await emails(db, crowded, 3000, -5)
    await emails(db, quiet, 1, -1)
    await emails(db, later, 5, 3600)  # not due yet
    await emails(db, busy, 5, -5, leased_for=60)  # due, but leased by a live process
    await emails(db, done, 5, None)  # nothing left to send
    async with db.transaction() as conn:
        await conn.execute("ANALYZE emails")
    async with db.transaction() as conn:
        owners = owners_of(await conn.fetch(EMAIL_LEASES.due_owners, 1000))
        read = await conn.fetchrow(READ, "emails")
    assert sorted(owners) == sorted([crowded, quiet])
    assert read["rows"] < 50, read  # not the 3,000 due emails of one team
    async with db.transaction() as conn:
        assert len(await conn.fetch(EMAIL_LEASES.due_owners, 1)) == 1


async def test_an_sms_poll_walks_teams_too(db: Database) -> None:
    crowded = await team(db, "a")
    async with db.transaction() as conn:
        await conn.execute(
            "INSERT INTO sms_messages (id, team_id, to_number, from_sender, body, status,"
            " encoding, segments, country, provider, next_attempt_at)"
            " SELECT gen_random_uuid(), $1, '+14155550100', 'Acme', 'hi', 'queued', 'GSM-7', 1,"
            " 'US', 'sandbox', now() - interval '5 seconds' FROM generate_series(1, 2000)",
            crowded,
        )
        await conn.execute("ANALYZE sms_messages")
    async with db.transaction() as conn:
        owners = owners_of(await conn.fetch(SMS_LEASES.due_owners, 1000))
        read = await conn.fetchrow(READ, "sms_messages")
    assert owners == [crowded]
    assert read["rows"] < 50, read


async def test_outcomes_read_the_events_of_their_own_emails_only(db: Database) -> None:
    acme = await team(db, "acme")
    async with db.transaction() as conn:
        # Statistics taken while the events were few, as on a database that
        # grew fast since its last ANALYZE.
        await conn.execute("ALTER TABLE email_events SET (autovacuum_enabled = false)")
        await conn.execute("ANALYZE email_events")
    crowd = await emails(db, acme, 4000, None)
    async with db.transaction() as conn:
        await conn.execute(
            "INSERT INTO email_events (id, email_id, team_id, type, recipient)"
            " SELECT gen_random_uuid(), e.id, $1, t.type, e.to_addresses[1]"
            " FROM emails e, unnest(ARRAY['queued', 'sent', 'delivered']) t(type)",
            acme,
        )
    mine = crowd[:2]
    outcomes = [
        Outcome(mine[0]["id"], mine[0]["recipient"].upper(), "delivered", "sandbox"),  # had it
        Outcome(mine[1]["id"], mine[1]["recipient"], "complained", "sandbox"),
        Outcome(mine[1]["id"], mine[1]["recipient"], "complained", "sandbox"),  # given twice
        Outcome(uuid4(), "nobody@x.example", "bounced", "sandbox"),  # no such email
    ]
    async with db.transaction() as conn:
        recorded = await record_outcomes(conn, outcomes)
        read = await conn.fetchrow(READ, "email_events")
    assert recorded == [False, True, False, False]
    assert read["seq_scan"] == 0, read
    assert read["rows"] < 50, read  # of the 12,000 events


async def test_a_report_finds_its_email_by_the_id_in_its_message_id(db: Database) -> None:
    acme = await team(db, "acme")
    crowd = await emails(db, acme, 3000, None)
    async with db.transaction() as conn:
        await conn.execute(
            "INSERT INTO email_events (id, email_id, team_id, type, recipient)"
            " VALUES (gen_random_uuid(), $1, $2, 'sent', $3)",
            crowd[0]["id"], acme, crowd[0]["recipient"],
        )
        await conn.execute("ANALYZE emails")
    mine = crowd[0]["id"]
    async with db.transaction() as conn:
        found = await sent_email(conn, f" <{mine}@acme.example> ")
        read = await conn.fetchrow(READ, "emails")
    assert found is not None and found.id == mine
    assert found.sent_to == {crowd[0]["recipient"]: crowd[0]["recipient"]}
    assert read["seq_scan"] == 0 and read["rows"] <= 1, read  # not the 3,000 emails
    async with db.transaction() as conn:
        assert await sent_email(conn, f"<{mine}@other.example>") is None  # its domain counts
        assert await sent_email(conn, f"<{uuid4()}@acme.example>") is None
        assert await sent_email(conn, "<1@acme.example>") is None  # not one Tidings gave
        assert await sent_email(conn, f"<{mine}@acme.example><x@y>") is None


async def test_a_claim_reads_the_emails_it_takes_not_the_whole_queue(db: Database) -> None:
    """A broadcast queues its team tens of thousands of emails at once, long
    before the statistics know of them: a claim still walks the due index in
    its order and stops at its limit, rather than reading every due email of
    the team and sorting them."""
    acme = await team(db, "acme")
    async with db.transaction() as conn:
        await conn.execute("ALTER TABLE emails SET (autovacuum_enabled = false)")
        await conn.execute("ANALYZE emails")  # while there are none
    await emails(db, acme, 20_000, -5)
    async with db.transaction() as conn:
        claimed = await claim_rows(conn, EMAIL_LEASES.claim, acme, uuid4(), 60, 50)
        read = await conn.fetchrow(INDEX_READ, "emails_due")
        # The caller's transaction gets its settings back after its claim.
        assert await conn.fetchval("SHOW enable_bitmapscan") == "on"
        assert await conn.fetchval("SHOW enable_seqscan") == "on"
    assert len(claimed) == 50
    assert read["entries"] < 1000, read  # not the 20,000 due
    async with db.acquire() as conn:  # a claim in a transaction of its own
        assert len(await claim_rows(conn, EMAIL_LEASES.claim, acme, uuid4(), 60, 50)) == 50
        assert await conn.fetchval("SHOW enable_bitmapscan") == "on"
    async with db.transaction() as conn:  # the poll for teams walks the index too
        assert owners_of(await conn.fetch(EMAIL_LEASES.due_owners, 1000)) == [acme]
        read = await conn.fetchrow(INDEX_READ, "emails_due")
    assert read["entries"] < 1000, read


async def test_taking_due_outcomes_reads_those_it_takes(db: Database) -> None:
    """The sandbox's outcomes wait in email_followups; each take reads the
    first due ones through the index, not the table, however stale the
    statistics (taken while the table was empty)."""
    acme = await team(db, "acme")
    crowd = await emails(db, acme, 5000, None)
    async with db.transaction() as conn:
        await conn.execute("ALTER TABLE email_followups SET (autovacuum_enabled = false)")
        await conn.execute("ANALYZE email_followups")
        await conn.execute(
            "INSERT INTO email_followups (email_id, recipient, type, due_at, provider)"
            " SELECT id, 'r@x.example', 'delivered', now() - interval '1 second', 'sandbox'"
            " FROM unnest($1::uuid[]) id", [row["id"] for row in crowd],
        )
    async with db.transaction() as conn:
        taken = await claim_rows(conn, TAKE_FOLLOWUPS, 50)
        read = await conn.fetchrow(READ, "email_followups")
    assert len(taken) == 50
    assert read["seq_scan"] == 0 and read["rows"] < 500, read  # not the 5,000


async def test_a_teams_own_emails_are_claimed_before_its_broadcasts(db: Database) -> None:
    """A broadcast has queued thousands of emails; the team's own emails that
    fall due later still go first, and finding them reads few entries."""
    acme = await team(db, "acme")
    async with db.transaction() as conn:
        await conn.execute("ANALYZE emails")  # while there are none
    async with db.transaction() as conn:  # a broadcast's, due a minute ago
        news = await conn.fetch(
            EMAILS.replace("leased_until)", "leased_until, broadcast_id, contact_id)")
                  .replace("$4 * interval '1 second'",
                           "$4 * interval '1 second', $5::uuid, gen_random_uuid()"),
            acme, 3000, -60, None, uuid4(),
        )
    own = await emails(db, acme, 3, -1)  # due a minute after the broadcast's
    async with db.transaction() as conn:
        claimed = await claim_rows(conn, EMAIL_LEASES.claim, acme, uuid4(), 60, 10)
        read = await conn.fetchrow(INDEX_READ, "emails_due")
        read_own = await conn.fetchrow(INDEX_READ, "emails_due_own")
    ids = [row["id"] for row in claimed]
    assert len(ids) == 10
    assert set(ids[:3]) == {row["id"] for row in own}
    assert set(ids[3:]) <= {row["id"] for row in news}
    assert read["entries"] + read_own["entries"] < 1000, (read, read_own)
    # With none of its own due, a claim takes the broadcast's in their order.
    async with db.transaction() as conn:
        more = await claim_rows(conn, EMAIL_LEASES.claim, acme, uuid4(), 60, 5)
    assert len(more) == 5 and not {row["id"] for row in more} & set(ids)
