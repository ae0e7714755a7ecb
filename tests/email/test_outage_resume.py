"""Sending resumes within seconds of the database answering again, however
long it was away: a crash on a storage outage restarts a child at least
every second (``tidings.actors.policy``), not after a backoff that grew
for as long as the outage lasted."""

from __future__ import annotations

import httpx
import pytest
import trio

from tests.db_proxy import DatabaseProxy
from tests.email.helpers import SENDER, events, ok
from tests.email.smtp_sink import running_sink
from tests.email.test_partial_sends import RECIPIENTS, HeldSink, acme, api, status, until
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


async def test_an_email_whose_recording_failed_in_an_outage_is_recorded_once_storage_answers(
    proxy: DatabaseProxy, database_url: str, nursery: trio.Nursery
) -> None:
    """An attempt that ran to its end while storage was down: its record
    fails, and so does handing it back. It is handed back (and its sends
    recorded) once storage answers, not when its lease (60 s) ends."""
    sink = HeldSink()
    with running_sink(sink) as port:
        async with api(proxy.url, port) as (service, base_url):
            credential = await acme(service, base_url)
            async with httpx.AsyncClient(base_url=base_url, headers=credential.headers) as client:
                body = {"from": SENDER, "to": RECIPIENTS, "subject": "Hi", "text": "Hi"}
                email_id = ok(await client.post("/emails", json=body), 202)["id"]
                await until(lambda: sink.waiting)  # mid-attempt, its lease held
                proxy.cut()
                sink.hold = False  # the attempt ends; recording it fails
                await until(lambda: sink.received("cy@example.com") == 1)
                await trio.sleep(3)
                await nursery.start(proxy.serve)
                back = trio.current_time()

                async def recorded() -> bool:
                    return await status(database_url, email_id) == "sent"

                await until(recorded, within=15)
                assert trio.current_time() - back < 5
                sent = [e for e in await events(client, email_id) if e["type"] == "sent"]
    # Recorded as it was sent: each recipient once, no second attempt.
    assert sorted(e["recipient"] for e in sent) == sorted(RECIPIENTS)
    assert all(sink.received(address) == 1 for address in RECIPIENTS)
