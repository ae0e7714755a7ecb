"""The index upkeep merges the GIN indexes' pending lists, so that accepting
statements never find them full (``tidings.actors.upkeep``).

``gin_clean_pending_list`` says how many pages a list held when it merges
it: after the upkeep has run, nothing is left for it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio

from tidings.actors.upkeep import keep_indexes
from tidings.config import Config
from tidings.service import open_service
from tidings.storage import tokens as token_store
from tidings.storage.db import Database, open_database

# $1 the team: messages whose search pieces go to the pending list.
MESSAGES = """
INSERT INTO sms_messages (id, team_id, to_number, from_sender, body, status, encoding,
                          segments, country, provider)
SELECT gen_random_uuid(), $1, '+1415555' || lpad(n::text, 4, '0'), 'Acme',
       'Your code is ' || n, 'queued', 'GSM-7', 1, 'US', 'sandbox'
FROM generate_series(1, 500) n
"""
EMAILS = """
INSERT INTO emails (id, team_id, from_address, from_email, to_addresses, to_lookup, send_to,
                    subject, status, domain, smtp_message_id)
SELECT id, $1, 'a@acme.example', 'a@acme.example', ARRAY['r' || n || '@x.example'],
       ARRAY['r' || n || '@x.example'], ARRAY['r' || n || '@x.example'], 'hi', 'queued',
       'acme.example', '<' || id || '@acme.example>'
FROM (SELECT gen_random_uuid() AS id, n FROM generate_series(1, 500) n) g
"""
LEFT = "SELECT gin_clean_pending_list($1::regclass)"


@pytest.fixture
async def db(config: Config) -> AsyncIterator[Database]:
    async with open_database(config) as database:
        yield database


async def pending(db: Database) -> None:
    async with db.transaction() as conn:
        team_id = await token_store.ensure_team(conn, "acme")
        await conn.execute(MESSAGES, team_id)
        await conn.execute(EMAILS, team_id)


async def left(db: Database, index: str) -> int:
    async with db.acquire() as conn:
        pages: int = await conn.fetchval(LEFT, index)
    return pages


async def test_the_pending_lists_are_merged_by_the_upkeep(db: Database) -> None:
    await pending(db)
    merged: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(keep_indexes, db, 0.05, merged.append)
        with trio.fail_after(10):
            while not merged:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert merged[0] > 0  # the pages the inserts left, both lists
    assert await left(db, "sms_search") == 0
    assert await left(db, "emails_to") == 0


async def test_inserts_leave_their_entries_pending_until_a_merge(
    db: Database
) -> None:
    await pending(db)
    assert await left(db, "sms_search") > 0
    assert await left(db, "emails_to") > 0


async def test_the_service_keeps_the_indexes(config: Config) -> None:
    async with open_service(config) as service:
        await pending(service.db)
        await trio.sleep(3)  # the upkeep runs every half second
        assert await left(service.db, "sms_search") == 0
        assert await left(service.db, "emails_to") == 0
