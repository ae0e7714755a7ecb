"""An email to several recipients that some have had and others not yet.

A retry after a partial success goes only to the deferred recipients, and
the email can no longer be moved or canceled. An attempt that was not
recorded (cut short by a shutdown after some recipients had their message,
or left by a process killed mid-send) leaves the email taken up, never
scheduled again; the next attempt goes to every recipient without an
outcome, those the unfinished one reached too (at least once).

A process that stalls past its leases begins no hand-over of the emails
it held: another process may be sending them already; an email it was
sending when it stalled, and claimed again after, goes once."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import httpx
import pytest
import trio
import triopg

from tests.conftest import Credential, assert_error
from tests.email.conftest import smtp_config, verified_domain
from tests.email.helpers import SENDER, events, later, ok
from tests.email.smtp_sink import Sink, running_sink
from tests.email.test_processes import serving, setup_team
from tidings.app import serve_http
from tidings.permissions import ALL_PERMISSIONS
from tidings.service import Service, open_service
from tidings.storage import emails_sending as sending
from tidings.storage import tokens as token_store
from tidings.storage.emails_accept import NewEmail, accept_emails
from tidings.storage.emails_manage import NotScheduled, cancel, reschedule

RECIPIENTS = ["ada@example.com", "slow@example.com", "cy@example.com"]


class HeldSink(Sink):
    """Keeps ``slow@example.com`` waiting at RCPT while ``hold`` is set, so an
    attempt is mid-way: the recipients before it have their message."""

    def __init__(self) -> None:
        super().__init__()
        self.hold = True
        self.waiting = False

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, options: list[str]
    ) -> str:
        while address == "slow@example.com" and self.hold:
            self.waiting = True
            await asyncio.sleep(0.02)
        return await super().handle_RCPT(server, session, envelope, address, options)

    def received(self, address: str) -> int:
        return sum(m.recipients == [address] for m in self.messages)


@pytest.fixture
def sink() -> HeldSink:
    return HeldSink()


@pytest.fixture
def port(sink: HeldSink) -> Iterator[int]:
    with running_sink(sink) as port:
        yield port


@asynccontextmanager
async def api(
    database_url: str, port: int, **settings: Any
) -> AsyncIterator[tuple[Service, str]]:
    """A service sending to the sink (with ``settings`` of its Config), and its HTTP base URL."""
    async with open_service(smtp_config(database_url, port).with_(**settings)) as service:
        async with trio.open_nursery() as nursery:
            binds: list[str] = await nursery.start(serve_http, service, "127.0.0.1", 0)
            yield service, binds[0]
            nursery.cancel_scope.cancel()


async def acme(service: Service, base_url: str) -> Credential:
    async with service.db.transaction() as conn:
        team_id = await token_store.ensure_team(conn, "acme")
        token, secret = await token_store.create_token(conn, team_id, ALL_PERMISSIONS)
    credential = Credential(team_id, token.id, secret)
    await verified_domain(service, base_url, credential, "acme.example")
    return credential


async def until(condition: Callable[[], Awaitable[bool] | bool], within: float = 20) -> None:
    with trio.fail_after(within):
        while True:
            met = condition()
            if met if isinstance(met, bool) else await met:
                return
            await trio.sleep(0.02)


async def status(database_url: str, email_id: str) -> str:
    async with triopg.connect(database_url) as conn:
        found: str = await conn.fetchval(
            "SELECT status FROM emails WHERE id = $1", UUID(email_id)
        )
    return found


async def cut_short(database_url: str, sink: HeldSink, port: int, *, scheduled: bool) -> str:
    """An email to RECIPIENTS (scheduled a moment ahead, or sent now) whose
    first attempt a shutdown cut short after ada@example.com had its
    message; its id."""
    async with api(database_url, port) as (service, base_url):
        credential = await acme(service, base_url)
        async with httpx.AsyncClient(base_url=base_url, headers=credential.headers) as client:
            body = {"from": SENDER, "to": RECIPIENTS, "subject": "Hi", "text": "Hi"}
            if scheduled:
                body["scheduled_at"] = later(seconds=1)
            email_id: str = ok(await client.post("/emails", json=body), 202)["id"]

        async def mid_way() -> bool:
            return sink.waiting and sink.received("ada@example.com") == 1

        await until(mid_way)
    # The shutdown's grace ran out with slow@example.com still waiting.
    assert sink.received("ada@example.com") == 1 and sink.received("cy@example.com") == 0
    return email_id


async def refused(database_url: str, email_id: UUID, shown: str = "being sent") -> None:
    """PATCH's and cancel's storage calls both refuse the email (409) as
    ``shown``, while no process runs that could take it up meanwhile."""
    async with triopg.connect(database_url) as conn:
        team_id = await conn.fetchval("SELECT team_id FROM emails WHERE id = $1", email_id)
        with pytest.raises(NotScheduled) as refusal:
            await reschedule(conn, team_id, email_id, datetime.now(UTC) + timedelta(hours=1))
        assert refusal.value.status == shown
        with pytest.raises(NotScheduled):
            async with conn.transaction():
                await cancel(conn, team_id, email_id)


async def test_a_send_cut_short_is_not_scheduled_any_more(
    database_url: str, sink: HeldSink, port: int
) -> None:
    """A scheduled email whose first attempt was cut short after a recipient
    had its message is no longer scheduled (that recipient's ``sent`` is
    recorded): cancel and PATCH are 409; the next process takes it up."""
    email_id = await cut_short(database_url, sink, port, scheduled=True)
    await refused(database_url, UUID(email_id), "sent")
    sink.hold = False
    async with api(database_url, port) as (service, base_url):
        async with service.db.acquire() as conn:
            team_id = await conn.fetchval(
                "SELECT team_id FROM emails WHERE id = $1", UUID(email_id))
            _token, secret = await token_store.create_token(conn, team_id, ALL_PERMISSIONS)
        headers = {"Authorization": f"Bearer {secret}"}
        async with httpx.AsyncClient(base_url=base_url, headers=headers) as client:

            async def done() -> bool:
                return bool(ok(await client.get(f"/emails/{email_id}"))["status"] == "sent")

            await until(done)
            assert_error(await client.post(f"/emails/{email_id}/cancel"), 409, "CONFLICT")
    assert sink.received("slow@example.com") == 1 and sink.received("cy@example.com") == 1


def _scheduled(team_id: UUID) -> NewEmail:
    return NewEmail(
        from_address=SENDER, from_email="hi@acme.example", to=RECIPIENTS,
        to_lookup=RECIPIENTS, cc=[], bcc=[], reply_to=[], send_to=RECIPIENTS, subject="Hi",
        html=None, text="Hi", headers={}, tags=[],
        scheduled_at=datetime.now(UTC) + timedelta(seconds=1), domain="acme.example",
        provider="smtp",
    )


async def test_an_email_left_mid_send_by_a_killed_process_is_not_scheduled(
    database_url: str, asyncio_bridge: None, tmp_path: Path, sink: HeldSink, port: int
) -> None:
    """kill -9 while a scheduled email is mid-send: once its lease has run
    out, cancel and PATCH still refuse it (a recipient may have it)."""
    async with triopg.connect(database_url) as conn:
        team_id = await setup_team(conn)
        email = _scheduled(team_id)
        await accept_emails(conn, team_id, [email])
        async with serving(database_url, port, tmp_path / "serve.log") as process:
            await until(lambda: sink.waiting and sink.received("ada@example.com") == 1)
            process.send_signal(signal.SIGKILL)
            await process.wait()
        # The lease runs out (10 s in `serving`): as if that much time had passed.
        await conn.execute("UPDATE emails SET leased_until = now() WHERE id = $1", email.id)
    sink.hold = False
    await refused(database_url, email.id)


class Partly(Sink):
    """Bounces ``gone@example.com`` at RCPT and defers ``busy@example.com``
    twice; counts the RCPTs each address gets."""

    def __init__(self) -> None:
        super().__init__()
        self.rcpts: Counter[str] = Counter()

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, options: list[str]
    ) -> str:
        self.rcpts[address] += 1
        if address == "gone@example.com":
            return "550 5.1.1 no such user"
        if address == "busy@example.com" and self.rcpts[address] <= 2:
            return "451 4.3.0 try later"
        return await super().handle_RCPT(server, session, envelope, address, options)


async def test_a_retry_after_a_partial_success_goes_to_the_deferred_alone(
    database_url: str,
) -> None:
    """Sent to ada, bounced at gone, busy deferred twice: the retries go to
    busy alone, and meanwhile the email cannot be moved or canceled."""
    sink = Partly()
    with running_sink(sink) as port:
        config = dataclasses.replace(smtp_config(database_url, port),
                                     email_retry_schedule=(1.0, 1.0, 1.0))
        async with open_service(config) as service, trio.open_nursery() as nursery:
            base_url = (await nursery.start(serve_http, service, "127.0.0.1", 0))[0]
            credential = await acme(service, base_url)
            async with httpx.AsyncClient(base_url=base_url,
                                         headers=credential.headers) as client:
                to = ["ada@example.com", "gone@example.com", "busy@example.com"]
                body = {"from": SENDER, "to": to, "subject": "Hi", "text": "Hi",
                        "scheduled_at": later(seconds=1)}
                email_id = ok(await client.post("/emails", json=body), 202)["id"]
                for tries in (1, 2):
                    await until(lambda: sink.rcpts["busy@example.com"] == tries)  # noqa: B023
                    assert_error(await client.post(f"/emails/{email_id}/cancel"),
                                 409, "CONFLICT")
                    assert_error(await client.patch(
                        f"/emails/{email_id}", json={"scheduled_at": later(hours=1)}),
                        409, "CONFLICT")

                async def done() -> bool:
                    return len(await events(client, email_id)) == 7

                await until(done)
                found = [(e["type"], e["recipient"])
                         for e in reversed(await events(client, email_id))]
            nursery.cancel_scope.cancel()
    assert found[:2] == [("scheduled", ", ".join(to)), ("queued", ", ".join(to))]
    assert sorted(found[2:]) == [
        ("bounced", "gone@example.com"),
        ("delivery_delayed", "busy@example.com"), ("delivery_delayed", "busy@example.com"),
        ("sent", "ada@example.com"), ("sent", "busy@example.com"),
    ]
    assert sink.rcpts == {"ada@example.com": 1, "gone@example.com": 1, "busy@example.com": 3}
    assert [m.recipients for m in sink.messages] == [["ada@example.com"], ["busy@example.com"]]


async def test_a_send_cut_short_is_not_sent_again_to_recipients_already_done(
    database_url: str, sink: HeldSink, port: int
) -> None:
    """ada@example.com, whose transaction had ended when the attempt was cut
    short, does not get the message again: what the provider had done is
    recorded, and the next attempt goes to the others alone."""
    email_id = await cut_short(database_url, sink, port, scheduled=False)
    assert await status(database_url, email_id) == "sent"  # ada's, recorded
    async with triopg.connect(database_url) as conn:
        # Cut short, the attempt used no step of the retry schedule.
        assert await conn.fetchval(
            "SELECT attempt_count FROM emails WHERE id = $1", UUID(email_id)) == 0
    sink.hold = False
    async with api(database_url, port):
        await until(lambda: sink.received("cy@example.com") == 1)
        await until(lambda: sink.received("slow@example.com") == 1)
    assert sink.received("ada@example.com") == 1


async def test_an_email_given_back_mid_send_stays_refused_whoever_takes_it_next(
    database_url: str,
) -> None:
    """An attempt cut short hands its email back unrecorded (a recipient may
    have it); a later claim handed back before its own attempt began does
    not make the email cancelable again."""
    async with triopg.connect(database_url) as conn:
        team_id = await setup_team(conn)
        email = _scheduled(team_id)
        await accept_emails(conn, team_id, [email])
        # Its time has come.
        await conn.execute("UPDATE emails SET next_attempt_at = now() WHERE id = $1", email.id)
        first, second = uuid4(), uuid4()
        [taken], _ = await sending.claim(conn, team_id, first, 30, 10)
        await sending.give_back(conn, [taken.id], first)  # its attempt had begun
        [again], _ = await sending.claim(conn, team_id, second, 30, 10)
        await sending.release(conn, [again.id], second)  # before its attempt began
    await refused(database_url, email.id, "being sent")


async def test_an_attempt_whose_recording_a_shutdown_cut_short_is_recorded_as_it_was(
    database_url: str, sink: HeldSink, port: int
) -> None:
    """Every recipient had the message; the shutdown's grace ran out while
    its recording waited (here on a lock): the attempt is recorded as it
    was as the worker stops, and the next process sends nobody anything."""
    release = trio.Event()

    async def hold_events(*, task_status: Any) -> None:
        async with triopg.connect(database_url) as conn, conn.transaction():
            await conn.execute("LOCK TABLE email_events IN SHARE MODE")  # recording waits
            task_status.started()
            await release.wait()

    async with trio.open_nursery() as nursery:
        async with api(database_url, port) as (service, base_url):
            credential = await acme(service, base_url)
            async with httpx.AsyncClient(base_url=base_url, headers=credential.headers) as client:
                body = {"from": SENDER, "to": RECIPIENTS, "subject": "Hi", "text": "Hi"}
                email_id: str = ok(await client.post("/emails", json=body), 202)["id"]
            await until(lambda: sink.waiting)
            await nursery.start(hold_events)
            sink.hold = False
            await until(lambda: sink.received("cy@example.com") == 1)

            async def let_go() -> None:
                await trio.sleep(2.5)  # past the 2 s grace, within the 2 s to hand back
                release.set()

            nursery.start_soon(let_go)
    assert await status(database_url, email_id) == "sent"
    async with api(database_url, port):
        await trio.sleep(1.5)  # a process that would send it again has had the time
    assert [sink.received(r) for r in RECIPIENTS] == [1, 1, 1]


# --- a process that stalls past its leases ---------------------------------------------

LEASE = 2.0


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
    # One connection to the relay: a second email waits for it, claimed.
    async with api(database_url, port, email_lease_seconds=LEASE, smtp_connections=1) as (
        service, base_url
    ):
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
