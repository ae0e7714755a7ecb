"""Retention: rows past their retention are deleted in batches, newer ones kept."""

from __future__ import annotations

from typing import Any
from uuid import UUID, uuid4

import trio

from tidings.actors.retention import RetentionSweeper, Sweep, sweeps
from tidings.config import Config
from tidings.service import Service
from tidings.storage import retention
from tidings.storage import tokens as token_store
from tidings.storage import webhooks as webhook_store
from tidings.storage.connection import AsyncioConnection
from tidings.storage.db import open_database
from tidings.storage.events import record_event

DAY = 86400
OLD = "now() - interval '40 days'"


async def ids(conn: Any, query: str) -> set[UUID]:
    return {row[0] for row in await conn.fetch(query)}


async def test_rows_past_retention_are_deleted_in_batches_and_newer_ones_kept(
    config: Config,
) -> None:
    async with open_database(config) as db, db.acquire() as conn:
        team_id = await token_store.ensure_team(conn, "acme")
        await webhook_store.create_endpoint(
            conn, team_id, url="https://example.com/hook", events=["*"],
            description=None, secret="whsec_test",
        )
        events = []
        for _ in range(6):
            event, deliveries = await record_event(
                conn, team_id, "message.delivered", channel="email", recipient="a@example.com"
            )
            assert deliveries == 1
            events.append(event.id)
        old_ok, old_failed, old_pending, old_retrying, new_event, new_event_old_delivery = events
        await conn.execute(
            f"UPDATE events SET created_at = {OLD} WHERE id = ANY($1)", events[:4]
        )
        for event_id, status in [
            (old_ok, "succeeded"), (old_failed, "failed"), (old_pending, "pending"),
            (old_retrying, "retrying"), (new_event, "succeeded"),
            (new_event_old_delivery, "succeeded"),
        ]:
            stale = event_id != new_event
            await conn.execute(
                f"UPDATE webhook_deliveries SET status = $2,"
                f" updated_at = {OLD if stale else 'now()'} WHERE event_id = $1",
                event_id, status,
            )
        await conn.execute(
            """
            INSERT INTO webhook_attempts (delivery_id, number, started_at, duration_ms)
            SELECT id, 1, now(), 5 FROM webhook_deliveries
            """
        )
        await conn.execute(
            """
            INSERT INTO idempotency_keys
                (scope, key, fingerprint, claim, status, locked_until, expires_at)
            SELECT $1, 'key-' || n, '\\x00', gen_random_uuid(), 'completed', now(),
                   CASE WHEN n <= 3 THEN now() - interval '1 second'
                        ELSE now() + interval '1 hour' END
            FROM generate_series(1, 5) AS n
            """,
            uuid4(),
        )

        # A batch of one: each statement deletes one row, until none is left.
        assert await retention.delete_events(conn, 30 * DAY, 1) == 2
        assert await retention.delete_deliveries(conn, 30 * DAY, 1) == 1
        assert await retention.delete_idempotency_records(conn, 1) == 3

        assert await ids(conn, "SELECT id FROM events") == {
            old_pending, old_retrying, new_event, new_event_old_delivery
        }
        assert await ids(conn, "SELECT event_id FROM webhook_deliveries") == {
            old_pending, old_retrying, new_event
        }
        attempts = await conn.fetchval("SELECT count(*) FROM webhook_attempts")
        assert attempts == 3  # those of the deliveries kept
        assert await conn.fetchval("SELECT count(*) FROM idempotency_keys") == 2
        assert await conn.fetchval(
            "SELECT count(*) FROM idempotency_keys WHERE expires_at <= now()"
        ) == 0

        # Nothing more is past retention: a second sweep deletes nothing.
        async def everything(conn: AsyncioConnection) -> list[int]:
            return [await sweep.delete(conn) for sweep in sweeps(config)]

        assert await db.run(everything) == [0, 0, 0]


async def test_the_sweeper_runs_each_sweep_on_its_own_interval(autojump_clock: Any) -> None:
    calls: list[tuple[str, float]] = []

    class Counting:
        def __init__(self, name: str) -> None:
            self.name = name

        async def __call__(self, conn: Any) -> int:
            calls.append((self.name, autojump_clock.current_time()))
            return 0

    class Direct:
        async def run(self, unit: Any, *args: Any) -> Any:
            return await unit(None, *args)



    sweeper = RetentionSweeper(
        Direct(),  # type: ignore[arg-type]
        [Sweep("fast", 60, Counting("fast")), Sweep("slow", 300, Counting("slow"))],
    )
    with trio.move_on_after(601):
        await sweeper.run()
    assert [name for name, _ in calls].count("fast") == 11
    assert [(name, at) for name, at in calls if name == "slow"] == [
        ("slow", 0), ("slow", 300), ("slow", 600)
    ]


async def test_the_service_runs_one_retention_singleton(service: Service) -> None:
    names = [child.name for child in service.runtime.children()]
    assert names.count("retention") == 1
    assert "idempotency-sweeper" not in names
