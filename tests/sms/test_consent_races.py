"""Consent writes in flight against each other (docs/sms.md, Consent): a
STOP or a START against a create or a PATCH of a contact, and a PATCH of the
status against a PATCH of the phone. Whichever commits first, no contact is
left claiming ``unknown`` or ``opted_in`` for a number whose STOP stands, nor
``opted_out`` for one that replied START since.

Each test holds one side's transaction open in a session of its own, runs
the other side through the API, and lets the held side commit once the
other has been answered or waits for a lock: without the team's consent
lock (and the PATCH's lock on the contact) the side that came second read a
state without the first and wrote over it, or missed it.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
import trio

from tests.conftest import Credential, assert_error
from tests.http.test_audience_races import LOCK_WAITERS, sessions
from tests.sms.helpers import ok
from tidings.config import Config
from tidings.providers.twilio import signature
from tidings.storage import contacts, sms_consent

TOKEN = "twilio-test-auth-token"
PUBLIC = "https://tidings.example"
NUMBER = "+14155550140"
OTHER = "+14155550141"
TEAM_NUMBER = "+14155550100"


@pytest.fixture
def config(database_url: str) -> Config:
    return Config(
        database_url=database_url, db_pool_size=4, rate_limit_per_second=0,
        shutdown_grace_seconds=2, twilio_auth_token=TOKEN, public_url=PUBLIC,
    )


async def meanwhile(
    database_url: str,
    hold: Callable[[Any], Awaitable[object]],
    request: Callable[[], Awaitable[httpx.Response]],
) -> httpx.Response:
    """Run ``request`` while a transaction of the test that ran ``hold`` is
    open; commit it once the request has been answered or waits for a lock.
    The answer."""
    answers: list[httpx.Response] = []

    async def run() -> None:
        answers.append(await request())

    async with sessions(database_url) as (holder, watcher), trio.open_nursery() as nursery:
        async with holder.transaction():
            await hold(holder)
            nursery.start_soon(run)
            with trio.fail_after(10):
                while not answers and await watcher.fetchval(LOCK_WAITERS) == 0:
                    await trio.sleep(0.01)
    return answers[0]


def stop(team_id: uuid.UUID) -> Callable[[Any], Awaitable[object]]:
    """The update a STOP from NUMBER makes, as the inbound route makes it."""
    return lambda conn: sms_consent.opt_out(conn, [team_id], NUMBER, None)


async def consent(client: httpx.AsyncClient, contact_id: str) -> tuple[str, str | None]:
    found = ok(await client.get(f"/contacts/{contact_id}"))
    return found["sms_consent_status"], found["sms_consent_source"]


async def test_opted_in_meeting_a_stop_in_flight_is_refused(
    client: httpx.AsyncClient, acme: Credential, database_url: str
) -> None:
    contact = ok(await client.post("/contacts", json={"phone": NUMBER}), 201)
    answer = await meanwhile(database_url, stop(acme.team_id), lambda: client.patch(
        f"/contacts/{contact['id']}", json={"sms_consent_status": "opted_in"}))
    assert "replied STOP" in assert_error(answer, 409, "CONFLICT")
    assert await consent(client, contact["id"]) == ("opted_out", "keyword")


async def test_a_phone_changed_to_a_number_stopping_meanwhile_is_opted_out(
    client: httpx.AsyncClient, acme: Credential, database_url: str
) -> None:
    contact = ok(await client.post("/contacts", json={
        "phone": OTHER, "sms_consent_status": "opted_in"}), 201)
    answer = await meanwhile(database_url, stop(acme.team_id), lambda: client.patch(
        f"/contacts/{contact['id']}", json={"phone": NUMBER}))
    ok(answer)
    assert await consent(client, contact["id"]) == ("opted_out", "keyword")


async def test_a_contact_created_with_a_number_stopping_meanwhile_is_opted_out(
    client: httpx.AsyncClient, acme: Credential, database_url: str
) -> None:
    answer = await meanwhile(database_url, stop(acme.team_id), lambda: client.post(
        "/contacts", json={"phone": NUMBER}))
    created = ok(answer, 201)
    assert await consent(client, created["id"]) == ("opted_out", "keyword")


async def inbound(http: httpx.AsyncClient, body: str) -> httpx.Response:
    """A reply from NUMBER to the team's long code, signed as Twilio signs it."""
    form = {"From": NUMBER, "To": TEAM_NUMBER, "Body": body, "MessageSid": "SM" + body}
    path = "/providers/twilio/inbound"
    headers = {"X-Twilio-Signature": signature(TOKEN, PUBLIC + path, form.items())}
    answer = await http.post(path, data=form, headers=headers)
    assert answer.status_code == 200, answer.text
    return answer


def phone_change(team_id: uuid.UUID, contact_id: str, status: str) -> Callable[
    [Any], Awaitable[object]
]:
    """A PATCH of the contact's phone to NUMBER, as the route makes it; it
    finds the contact ``status``."""
    changes = contacts.ContactChanges(
        given=frozenset({"phone"}), phone=NUMBER, normalized_phone=NUMBER, phone_country="US")

    async def change(conn: Any) -> None:
        changed = await contacts.update_contact(conn, team_id, uuid.UUID(contact_id), changes)
        assert changed is not None and changed.sms_consent_status == status

    return change


async def test_a_stop_meeting_a_phone_change_in_flight_opts_the_contact_out(
    client: httpx.AsyncClient, http: httpx.AsyncClient, acme: Credential, database_url: str
) -> None:
    ok(await client.post("/sender-ids", json={"value": TEAM_NUMBER, "type": "long_code"}), 201)
    contact = ok(await client.post("/contacts", json={
        "phone": OTHER, "sms_consent_status": "opted_in"}), 201)
    await meanwhile(database_url, phone_change(acme.team_id, contact["id"], "opted_in"),
                    lambda: inbound(http, "STOP"))
    assert await consent(client, contact["id"]) == ("opted_out", "keyword")


async def test_a_start_meeting_a_phone_change_in_flight_opts_the_contact_in(
    client: httpx.AsyncClient, http: httpx.AsyncClient, acme: Credential, database_url: str
) -> None:
    ok(await client.post("/sender-ids", json={"value": TEAM_NUMBER, "type": "long_code"}), 201)
    contact = ok(await client.post("/contacts", json={"phone": OTHER}), 201)
    await inbound(http, "STOP")
    await meanwhile(database_url, phone_change(acme.team_id, contact["id"], "opted_out"),
                    lambda: inbound(http, "START"))
    assert await consent(client, contact["id"]) == ("opted_in", "keyword")


async def test_opted_in_meeting_a_phone_change_in_flight_is_refused(
    client: httpx.AsyncClient, http: httpx.AsyncClient, acme: Credential, database_url: str
) -> None:
    """The STOP stood before both: the PATCH checks the number the contact
    has when it writes, not the one it had when the PATCH began."""
    ok(await client.post("/sender-ids", json={"value": TEAM_NUMBER, "type": "long_code"}), 201)
    contact = ok(await client.post("/contacts", json={"phone": OTHER}), 201)
    await inbound(http, "STOP")
    answer = await meanwhile(
        database_url, phone_change(acme.team_id, contact["id"], "opted_out"),
        lambda: client.patch(f"/contacts/{contact['id']}", json={"sms_consent_status": "opted_in"}),
    )
    assert "replied STOP" in assert_error(answer, 409, "CONFLICT")
    assert await consent(client, contact["id"]) == ("opted_out", "keyword")


async def test_an_import_row_opting_in_a_number_stopping_meanwhile_is_refused(
    client: httpx.AsyncClient, acme: Credential, database_url: str
) -> None:
    """The import holds the consent lock a contact write holds: the STOP in
    flight is waited for, and the row that opts its number in is refused."""
    rows = [{"email": "stopping@example.com", "phone": NUMBER, "sms_consent_status": "opted_in"},
            {"email": "other@example.com", "phone": OTHER, "sms_consent_status": "opted_in"}]
    answer = await meanwhile(database_url, stop(acme.team_id), lambda: client.post(
        "/contacts/import", json={"contacts": rows}))
    result = ok(answer)
    listed = ok(await client.get("/contacts"))["data"]
    assert {c["phone"]: c["sms_consent_status"] for c in listed}.get(NUMBER) != "opted_in", result
    assert {c["phone"] for c in listed} == {OTHER}, result
