"""Sending resumes within seconds of the database answering again, however
long it was away: a crash on a storage outage restarts a child at least
every second (``tidings.actors.policy``), not after a backoff that grew
for as long as the outage lasted."""

from __future__ import annotations

import httpx
import pytest
import trio

from tests.db_proxy import DatabaseProxy
from tests.email.helpers import SENDER, ok
from tidings.config import Config


@pytest.fixture
def config(proxy: DatabaseProxy) -> Config:
    # The service reaches its database through the proxy, which the test cuts.
    return Config(database_url=proxy.url, db_pool_size=4, rate_limit_per_second=0,
                  shutdown_grace_seconds=2)


async def test_an_email_accepted_after_a_long_outage_is_sent_within_seconds(
    client: httpx.AsyncClient, acme_domain: str, proxy: DatabaseProxy, nursery: trio.Nursery
) -> None:
    proxy.cut()
    # Long enough for a doubling backoff (0.1 s, 0.2 s, ...) to reach 12.8 s:
    # the dispatchers of due emails crash on every try meanwhile.
    await trio.sleep(20)
    await nursery.start(proxy.serve)
    body = {"from": SENDER, "to": "ada@example.com", "subject": "Hi", "html": "<p>Hi</p>"}
    with trio.fail_after(10):
        while (accepted := await client.post("/emails", json=body)).status_code == 503:
            await trio.sleep(0.1)
    email_id = ok(accepted, 202)["id"]
    since = trio.current_time()
    with trio.fail_after(15):
        while (email := ok(await client.get(f"/emails/{email_id}")))["status"] == "queued":
            await trio.sleep(0.05)
    assert email["status"] in ("sent", "delivered"), email
    assert trio.current_time() - since < 3
