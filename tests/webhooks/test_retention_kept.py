"""An event stays while one of its deliveries is within the deliveries' retention."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from tidings.actors.retention import sweeps
from tidings.config import Config
from tidings.storage import retention
from tidings.storage import tokens as token_store
from tidings.storage import webhooks as webhook_store
from tidings.storage.db import Database, open_database
from tidings.storage.events import record_event

DAY = 86400


async def old_events(conn: Any, team_id: UUID, ages: dict[str, tuple[int, str, int]]) -> dict[
    str, UUID
]:
    """One event per name, ``created`` days old, its delivery in ``status`` and
    last changed ``changed`` days ago, with one attempt."""
    made = {}
    for name, (created, status, changed) in ages.items():
        event, deliveries = await record_event(
            conn, team_id, "message.delivered", channel="email", recipient="a@example.com"
        )
        assert deliveries == 1
        await conn.execute(
            "UPDATE events SET created_at = now() - $2 * interval '1 day' WHERE id = $1",
            event.id, created,
        )
        await conn.execute(
            "UPDATE webhook_deliveries SET status = $2,"
            " updated_at = now() - $3 * interval '1 day' WHERE event_id = $1",
            event.id, status, changed,
        )
        made[name] = event.id
    await conn.execute(
        "INSERT INTO webhook_attempts (delivery_id, number, started_at, duration_ms)"
        " SELECT id, 1, now(), 5 FROM webhook_deliveries"
    )
    return made


async def sweep_counts(db: Database, config: Config) -> dict[str, int]:
    """What each webhook sweep of the service's sweeper deletes, in its order."""
    return {
        sweep.name: await sweep.delete(db) for sweep in sweeps(config)
        if sweep.name in ("events", "webhook deliveries")
    }


async def ids(conn: Any, query: str) -> set[UUID]:
    return {row[0] for row in await conn.fetch(query)}


async def test_a_delivery_retried_late_keeps_its_event_and_attempts(config: Config) -> None:
    async with open_database(config) as db:
        async with db.acquire() as conn:
            team_id = await token_store.ensure_team(conn, "acme")
            await webhook_store.create_endpoint(
                conn, team_id, url="https://example.com/hook", events=["*"],
                description=None, secret="whsec_test",
            )
            made = await old_events(conn, team_id, {
                # Retried by hand a day ago, then failed again: within its retention.
                "retried": (40, "failed", 1),
                "succeeded_lately": (31, "succeeded", 29),
                "done_long_ago": (40, "succeeded", 35),
                "pending": (40, "pending", 40),
            })
        assert await sweep_counts(db, config) == {"events": 1, "webhook deliveries": 0}
        async with db.acquire() as conn:
            assert await ids(conn, "SELECT id FROM events") == {
                made["retried"], made["succeeded_lately"], made["pending"]
            }
            assert await ids(conn, "SELECT event_id FROM webhook_deliveries") == {
                made["retried"], made["succeeded_lately"], made["pending"]
            }
            assert await conn.fetchval("SELECT count(*) FROM webhook_attempts") == 3

            # Once the delivery's own retention has passed, the event goes too.
            await conn.execute(
                "UPDATE webhook_deliveries SET updated_at = now() - interval '31 days'"
                " WHERE event_id = $1", made["retried"],
            )
        assert await sweep_counts(db, config) == {"events": 1, "webhook deliveries": 0}
        async with db.acquire() as conn:
            assert await ids(conn, "SELECT id FROM events") == {
                made["succeeded_lately"], made["pending"]
            }


async def test_a_longer_delivery_retention_keeps_the_event_as_long(config: Config) -> None:
    async with open_database(config) as db, db.acquire() as conn:
        team_id = await token_store.ensure_team(conn, "acme")
        await webhook_store.create_endpoint(
            conn, team_id, url="https://example.com/hook", events=["*"],
            description=None, secret="whsec_test",
        )
        made = await old_events(conn, team_id, {"kept": (50, "failed", 45)})
        assert await retention.delete_events(conn, 30 * DAY, 10, 60 * DAY) == 0
        assert await retention.delete_deliveries(conn, 60 * DAY, 10) == 0
        assert await ids(conn, "SELECT id FROM events") == {made["kept"]}
        assert await retention.delete_events(conn, 30 * DAY, 10, 40 * DAY) == 1
        assert await ids(conn, "SELECT id FROM events") == set()
