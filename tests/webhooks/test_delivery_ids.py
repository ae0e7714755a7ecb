"""A delivery's id is named by its event and endpoint (``name_id``), as a
broadcast email's ``queued`` event is by its email: ids PostgreSQL makes for
many rows at once without reading ``/dev/urandom`` for each."""

from __future__ import annotations

from hashlib import md5
from uuid import UUID

from tidings.config import Config
from tidings.ids import new_id
from tidings.storage import tokens as token_store
from tidings.storage import webhooks as webhook_store
from tidings.storage.db import open_database
from tidings.storage.events import NewEvent, record_event, record_events


def named(name: str) -> UUID:
    """The RFC 4122 version 3 UUID that ``name_id`` makes of ``name``."""
    return UUID(bytes=md5(name.encode()).digest(), version=3)


async def test_each_delivery_is_named_by_its_event_and_endpoint(config: Config) -> None:
    async with open_database(config) as db, db.acquire() as conn:
        team_id = await token_store.ensure_team(conn, "acme")
        endpoints = [
            await webhook_store.create_endpoint(
                conn, team_id, url=f"https://example.com/hook/{n}", events=["*"],
                description=None, secret="whsec_test",
            )
            for n in range(2)
        ]
        one, _ = await record_event(conn, team_id, "message.sent", channel="email")
        many = [NewEvent(new_id(), team_id, "message.delivered", "email") for _ in range(3)]
        await record_events(conn, many)
        rows = await conn.fetch(
            "SELECT id, event_id, endpoint_id FROM webhook_deliveries WHERE team_id = $1", team_id
        )
    events = {one.id, *(e.id for e in many)}
    assert {(r["event_id"], r["endpoint_id"]) for r in rows} == {
        (event, endpoint.id) for event in events for endpoint in endpoints
    }
    for row in rows:
        assert row["id"] == named(f"{row['event_id']}{row['endpoint_id']}")
        assert (row["id"].version, row["id"].variant) == (3, "specified in RFC 4122")
