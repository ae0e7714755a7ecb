"""The statement that stores a group of text messages from arrays is
planned once per connection, not at every execution.

PostgreSQL makes a plan for each execution of a prepared statement until a
plan made once (the generic plan) costs no more than those; with arrays as
parameters it counts on 10 rows from each ``unnest``, and the generic plan
never won (the LIMIT in ``tidings.storage.sms_group.ACCEPT_GROUP``). ``pg_prepared_statements``
says, per statement of the connection, how many executions each kind of
plan served.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from uuid import UUID

import pytest

from tidings.config import Config, QuotaDefaults
from tidings.storage import tokens as token_store
from tidings.storage.connection import AsyncioConnection, Row
from tidings.storage.db import Database, open_database
from tidings.storage.sender_ids import create_sender_id
from tidings.storage.sms import NewSms, accept
from tidings.storage.sms_group import ACCEPT_GROUP, accept_group

PLANS = """
SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1
"""

# More executions than the five plans PostgreSQL makes before it compares.
SIZES = [4, 3, 5, 2, 4, 6, 3, 4, 2, 5]


@pytest.fixture
async def db(config: Config) -> AsyncIterator[Database]:
    async with open_database(config) as database:
        yield database


def message(n: int) -> NewSms:
    return NewSms(to=f"+1415555{n:04d}", country="US", sender_candidates=["Acme"],
                  body=f"Code {n}", encoding="GSM-7", segments=1, provider="sandbox",
                  metadata=None, scheduled_at=datetime.now(UTC) + timedelta(days=1))


async def _sender(conn: AsyncioConnection, team_id: UUID) -> None:
    await create_sender_id(conn, team_id, "Acme", "alphanumeric", "approved", [])


async def _groups(conn: AsyncioConnection, team_id: UUID) -> Row | None:
    # The first, alone, makes the quota's stripes that a group counts on.
    await accept(conn, team_id, message(0), QuotaDefaults())
    sent = 1
    for size in SIZES:
        stored = await accept_group(
            conn, team_id, [message(sent + n) for n in range(size)], QuotaDefaults()
        )
        assert len(stored) == size
        sent += size
    return await conn.fetchrow(PLANS, ACCEPT_GROUP)


def planned_once(plans: Row | None) -> None:
    assert plans is not None
    # Five made for their executions while PostgreSQL compares, then the one.
    assert plans["generic_plans"] == len(SIZES) - 5, dict(plans)
    assert plans["custom_plans"] == 5, dict(plans)


async def test_a_group_of_text_messages_is_planned_once(db: Database) -> None:
    async with db.transaction() as conn:
        team_id = await token_store.ensure_team(conn, "acme")
    await db.run(_sender, team_id)
    planned_once(await db.run(_groups, team_id))

