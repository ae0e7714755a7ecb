"""A clean stop gives attempts in flight 5 s, not the receiver's whole timeout."""

from __future__ import annotations

import trio

from tests.webhooks.conftest import FAST
from tests.webhooks.receiver import Answer, Received, Receiver
from tidings.actors.webhooks import STOP_SECONDS
from tidings.config import Config
from tidings.service import open_service
from tidings.storage import tokens as token_store
from tidings.storage import webhooks as webhook_store
from tidings.storage.db import open_database
from tidings.storage.events import record_event

RECEIVER_SECONDS = 8.0  # more than STOP_SECONDS, less than the timeout


async def test_a_stop_cuts_a_slow_attempt_short_and_gives_its_delivery_back(
    database_url: str, nursery: trio.Nursery
) -> None:
    async def slow(_request: Received) -> Answer:
        await trio.sleep(RECEIVER_SECONDS)
        return 200, b"ok", {}

    receiver = Receiver(slow)
    await nursery.start(receiver.serve)
    config = Config(
        database_url=database_url, db_pool_size=6, rate_limit_per_second=0,
        **{**FAST, "webhook_timeout_seconds": 15.0, "shutdown_grace_seconds": 30.0},
    )
    async with open_service(config) as service:
        async with service.db.transaction() as conn:
            team_id = await token_store.ensure_team(conn, "acme")
            endpoint = await webhook_store.create_endpoint(
                conn, team_id, url=receiver.url, events=["*"], description=None,
                secret="whsec_test",
            )
            await record_event(
                conn, team_id, "message.delivered", channel="sms", recipient="+14155550100"
            )
        await receiver.wait_for(1)
        await trio.sleep(0.5)
        stopping = trio.current_time()
    took = trio.current_time() - stopping
    assert STOP_SECONDS - 0.5 < took < STOP_SECONDS + 1.5, took

    async with open_database(config, run_migrations=False) as db, db.acquire() as conn:
        delivery = await conn.fetchrow(
            "SELECT status, attempt_count, lease_owner, leased_until FROM webhook_deliveries"
            " WHERE endpoint_id = $1", endpoint.id,
        )
        attempts = await conn.fetchval("SELECT count(*) FROM webhook_attempts")
    # Not recorded, and given back: the next process may send it at once.
    assert delivery["status"] == "pending" and delivery["attempt_count"] == 0
    assert delivery["lease_owner"] is None and delivery["leased_until"] is None
    assert attempts == 0
