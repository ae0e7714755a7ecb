"""Sending resumes within seconds of the database answering again, however
long it was away: a crash on a storage outage restarts a child at least
every second (``tidings.actors.policy``), not after a backoff that grew
for as long as the outage lasted."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import trio

from tests.db_proxy import DatabaseProxy
from tests.email.helpers import SENDER, events, ok
from tests.email.smtp_sink import Sink, running_sink
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


async def send_each(client: httpx.AsyncClient, *addresses: str) -> list[str]:
    """One email to each address; their ids."""
    return [ok(await client.post("/emails", json={
        "from": SENDER, "to": to, "subject": "Hi", "text": "Hi",
    }), 202)["id"] for to in addresses]


class Holds(Sink):
    """Keeps each address in ``held`` waiting at RCPT until it is let go."""

    def __init__(self, *held: str) -> None:
        super().__init__()
        self.held = set(held)
        self.waiting: set[str] = set()

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, options: list[str]
    ) -> str:
        while address in self.held:
            self.waiting.add(address)
            await asyncio.sleep(0.02)
        return await super().handle_RCPT(server, session, envelope, address, options)

    def received(self, address: str) -> int:
        return sum(m.recipients == [address] for m in self.messages)


async def test_an_email_sent_while_a_failed_record_waits_for_storage_is_recorded_after_it(
    proxy: DatabaseProxy, database_url: str, nursery: trio.Nursery
) -> None:
    """The record of one email fails in an outage, and its hand-back waits
    for storage; meanwhile another email's attempt ends. Once storage
    answers, both are recorded as they were sent: neither waits for its
    lease nor goes out again."""
    sink = Holds("first@example.com", "second@example.com")
    with running_sink(sink) as port:
        async with api(proxy.url, port) as (service, base_url):
            credential = await acme(service, base_url)
            async with httpx.AsyncClient(base_url=base_url, headers=credential.headers) as client:
                ids = await send_each(client, "first@example.com", "second@example.com")
                await until(lambda: len(sink.waiting) == 2)  # both mid-attempt
                proxy.cut()
                sink.held.discard("first@example.com")  # its record fails
                await until(lambda: sink.received("first@example.com") == 1)
                await trio.sleep(1)
                sink.held.discard("second@example.com")  # ends while the first waits
                await until(lambda: sink.received("second@example.com") == 1)
                await trio.sleep(1)
                await nursery.start(proxy.serve)
                back = trio.current_time()

                async def both_sent() -> bool:
                    return [await status(database_url, i) for i in ids] == ["sent", "sent"]

                await until(both_sent, within=15)
                assert trio.current_time() - back < 5
    assert sink.received("first@example.com") == 1
    assert sink.received("second@example.com") == 1


class CountingHolds(Holds):
    """``Holds``, counting the RCPT commands each address was given: an
    attempt cut short mid-transaction and made again gives a second."""

    def __init__(self, *held: str) -> None:
        super().__init__(*held)
        self.rcpts: dict[str, int] = {}

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, options: list[str]
    ) -> str:
        self.rcpts[address] = self.rcpts.get(address, 0) + 1
        return await super().handle_RCPT(server, session, envelope, address, options)


async def test_an_outage_cuts_no_send_under_way_short(
    proxy: DatabaseProxy, database_url: str, nursery: trio.Nursery
) -> None:
    """Storage goes away while one email is mid-transaction at the relay and
    another's attempt ends (its record fails), long enough for lease
    renewals (every second here) to fail too, and comes back while the first
    is still under way. The first's transaction is not cut short (the
    recipient mid-transaction of a cut attempt may get the message twice): it
    goes on to its end, and both are recorded once, each sent once."""
    sink = CountingHolds("slow@example.com", "quick@example.com")
    with running_sink(sink) as port:
        async with api(proxy.url, port, email_lease_seconds=6) as (service, base_url):
            credential = await acme(service, base_url)
            async with httpx.AsyncClient(base_url=base_url, headers=credential.headers) as client:
                ids = await send_each(client, "slow@example.com", "quick@example.com")
                await until(lambda: len(sink.waiting) == 2)  # both mid-attempt
                proxy.cut()
                sink.held.discard("quick@example.com")  # its attempt ends: its record fails
                await until(lambda: sink.received("quick@example.com") == 1)
                await trio.sleep(2.5)  # past two renewals
                await nursery.start(proxy.serve)
                await trio.sleep(2)  # storage answers; the slow one is still under way
                sink.held.discard("slow@example.com")

                async def both_sent() -> bool:
                    return [await status(database_url, i) for i in ids] == ["sent", "sent"]

                await until(both_sent, within=20)
                sent = [e for i in ids for e in await events(client, i) if e["type"] == "sent"]
    assert sink.rcpts == {"slow@example.com": 1, "quick@example.com": 1}
    assert sink.received("slow@example.com") == 1 and sink.received("quick@example.com") == 1
    assert sorted(e["recipient"] for e in sent) == ["quick@example.com", "slow@example.com"]
