"""A process that stalls past its leases begins no hand-over of the emails
it held: another process may be sending them already. An email it was
sending when it stalled, and claimed again after, goes once."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from uuid import UUID

import asyncpg
import httpx
import pytest
import trio
import triopg

from tests.email.conftest import smtp_config
from tests.email.helpers import SENDER, ok
from tests.email.smtp_sink import running_sink
from tests.email.test_partial_sends import HeldSink, acme, until
from tidings.app import serve_http
from tidings.service import Service, open_service

LEASE = 2.0


@pytest.fixture
def sink() -> HeldSink:
    return HeldSink()


@pytest.fixture
def port(sink: HeldSink) -> Iterator[int]:
    with running_sink(sink) as port:
        yield port


@asynccontextmanager
async def api(database_url: str, port: int) -> AsyncIterator[tuple[Service, str]]:
    # One connection to the relay: a second email waits for it, claimed.
    config = smtp_config(database_url, port).with_(
        email_lease_seconds=LEASE, smtp_connections=1
    )
    async with open_service(config) as service:
        async with trio.open_nursery() as nursery:
            binds: list[str] = await nursery.start(serve_http, service, "127.0.0.1", 0)
            yield service, binds[0]
            nursery.cancel_scope.cancel()


def take_over(database_url: str, email_id: UUID, taken: list[bool]) -> None:
    """Another process claims the email once its lease has ended (and keeps
    it, sending nothing)."""

    async def claim() -> None:
        conn = await asyncpg.connect(database_url)
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                status = await conn.execute(
                    "UPDATE emails SET lease_owner = gen_random_uuid(),"
                    " leased_until = now() + interval '60 seconds'"
                    " WHERE id = $1 AND leased_until < now()", email_id)
                if status == "UPDATE 1":
                    taken.append(True)
                    return
                await asyncio.sleep(0.05)
        finally:
            await conn.close()

    asyncio.new_event_loop().run_until_complete(claim())


async def test_a_stalled_process_does_not_send_what_another_took_over(
    database_url: str, sink: HeldSink, port: int
) -> None:
    async with api(database_url, port) as (service, base_url):
        credential = await acme(service, base_url)
        async with httpx.AsyncClient(base_url=base_url, headers=credential.headers) as client:
            body = {"from": SENDER, "subject": "Hi", "text": "Hi"}
            ok(await client.post("/emails", json={**body, "to": "slow@example.com"}), 202)
            await until(lambda: sink.waiting)  # it holds the only connection
            waiting = ok(await client.post("/emails", json={**body, "to": "bo@example.com"}), 202)
            email_id = UUID(waiting["id"])

            async def claimed() -> bool:
                async with triopg.connect(database_url) as conn:
                    return bool(await conn.fetchval(
                        "SELECT lease_owner IS NOT NULL FROM emails WHERE id = $1", email_id))

            await until(claimed)
            # The process stalls (a pause, a swap storm) past the lease, and
            # another process takes the waiting email over meanwhile.
            taken: list[bool] = []
            other = threading.Thread(target=take_over, args=(database_url, email_id, taken))
            other.start()
            time.sleep(LEASE + 1.5)  # noqa: ASYNC251 - the stall itself
            other.join()
            assert taken == [True]
            sink.hold = False
            await until(lambda: sink.received("slow@example.com") >= 1)
            await trio.sleep(1.0)
            # The email mid-way goes once: this process, whose lease on it
            # ended and which claimed it again, does not begin it twice ...
            assert sink.received("slow@example.com") == 1
            # ... and the one another process took is left to that process.
            assert sink.received("bo@example.com") == 0
