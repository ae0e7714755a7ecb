"""``POST /sms/{id}/sync`` against a slow Twilio: syncs waiting for the
provider hold no pooled connection, so the service's other requests are
served meanwhile, and each sync then applies what the provider said."""

from __future__ import annotations

import httpx
import pytest
import trio

from tests.sms.helpers import ok
from tests.sms.test_twilio import PUBLIC, sent_through_twilio
from tests.sms.twilio_double import TwilioDouble, started, twilio_config
from tidings.config import Config

POOL = 2  # TIDINGS_DB_POOL_SIZE: the smallest allowed


@pytest.fixture
async def double(nursery: trio.Nursery) -> TwilioDouble:
    return await started(nursery, owned_numbers={"+14155550100"})


@pytest.fixture
def config(database_url: str, double: TwilioDouble) -> Config:
    return twilio_config(database_url, double, PUBLIC, db_pool_size=POOL)


async def test_syncs_waiting_on_the_provider_leave_the_pool_to_other_requests(
    client: httpx.AsyncClient, double: TwilioDouble
) -> None:
    sms = await sent_through_twilio(client)
    double.messages[sms["message_id"]]["status"] = "delivered"
    asked: list[str] = []
    answer = trio.Event()

    async def slowly(sid: str) -> None:
        asked.append(sid)
        await answer.wait()

    double.before_fetched = slowly
    synced: list[str] = []

    async def sync() -> None:
        synced.append(ok(await client.post(f"/sms/{sms['id']}/sync"))["last_event"])

    async with trio.open_nursery() as nursery:
        for _ in range(POOL):
            nursery.start_soon(sync)
        try:
            with trio.fail_after(5):
                while len(asked) < POOL:
                    await trio.sleep(0.01)
            # Routes on either pool answer while every sync waits for Twilio
            # (which it does until the end: a request waiting for a
            # connection would wait past any bound; 5 s is for a loaded machine).
            with trio.fail_after(5):
                assert ok(await client.get("/sender-ids"))["data"][0]["value"] == (
                    "+14155550100"
                )
                assert ok(await client.get("/sms"))[0]["id"] == sms["id"]
                assert ok(await client.get(f"/sms/{sms['id']}"))["last_event"] == "submitted"
        finally:
            answer.set()
    assert synced == ["delivered"] * POOL


async def test_a_sync_with_an_idempotency_key_is_replayed(
    client: httpx.AsyncClient, double: TwilioDouble
) -> None:
    """Without a connection of its own, a sync's response is still stored
    for its key, after the provider's answer is applied."""
    sms = await sent_through_twilio(client)
    double.messages[sms["message_id"]]["status"] = "delivered"
    headers = {"Idempotency-Key": "sync-once"}
    first = await client.post(f"/sms/{sms['id']}/sync", headers=headers)
    assert ok(first)["last_event"] == "delivered"
    again = await client.post(f"/sms/{sms['id']}/sync", headers=headers)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.content == first.content
