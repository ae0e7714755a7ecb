"""Suppressions: normalised, unique per team, one question for many addresses,
and a phone's ``sms_opt_out`` doing to the team's contacts what a STOP does."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import httpx

from tests.conftest import Credential, MakeToken, assert_error
from tests.http.audience import create, make, ok
from tests.sms.test_consent_races import NUMBER, OTHER, consent, meanwhile, phone_change
from tidings.service import Service
from tidings.storage import suppressions as suppression_store


async def suppress(client: httpx.AsyncClient, address: str, **more: Any) -> dict[str, Any]:
    return await make(client, "/suppressions", address=address, **more)


async def test_addresses_are_normalised_and_unique(client: httpx.AsyncClient) -> None:
    # The message that caused it: one of the team's (an SMS here).
    assert (await client.post("/sender-ids", json={"value": "Acme", "type": "alphanumeric"})
            ).status_code == 201
    sent = await client.post("/sms", json={"to": "+14155552671", "from": "Acme", "body": "hi"})
    message_id = ok(sent, 202)["id"]
    email = await suppress(client, " Ada@Example.COM ", reason="bounce",
                           source_message_id=message_id)
    assert email["object"] == "suppression"
    assert (email["address"], email["kind"], email["reason"], email["source_message_id"]) == (
        "ada@example.com", "email", "bounce", message_id
    )
    phone = await suppress(client, "+44 20 7946 0958", reason="sms_opt_out")
    assert (phone["address"], phone["kind"], phone["source_message_id"]) == (
        "+442079460958", "phone", None
    )
    assert (await suppress(client, "bob@example.com"))["reason"] == "manual"

    for again in ("ADA@example.com", "+442079460958", "+44 (0)20 7946 0958"):
        response = await client.post("/suppressions", json={"address": again})
        assert "address" in assert_error(response, 409, "CONFLICT"), again
    assert ok(await client.get(f"/suppressions/{email['id']}")) == email


async def test_a_source_message_must_be_one_of_the_team(
    client: httpx.AsyncClient, make_token: MakeToken
) -> None:
    """Neither a made-up id nor another team's message is recorded (nor told apart)."""
    other = await make_token(team="other")
    async with httpx.AsyncClient(base_url=client.base_url, headers={
        "Authorization": f"Bearer {other.secret}"
    }) as theirs:
        assert (await theirs.post("/sender-ids", json={"value": "Other",
                                                        "type": "alphanumeric"})).status_code == 201
        sent = await theirs.post("/sms", json={"to": "+14155552671", "from": "Other",
                                               "body": "hi"})
        their_message = ok(sent, 202)["id"]
    for source in (str(uuid.uuid4()), their_message):
        response = await client.post("/suppressions", json={
            "address": "ada@example.com", "source_message_id": source})
        message = assert_error(response, 404, "NOT_FOUND")
        assert message == f"source_message_id: message {source} not found"
    assert ok(await client.get("/suppressions"))["data"] == []


async def test_suppression_refusals(client: httpx.AsyncClient) -> None:
    refusals: list[tuple[dict[str, Any], str]] = [
        ({}, "address"),
        ({"address": ""}, "address"),
        ({"address": "ada@"}, "address"),
        ({"address": "ada@localhost"}, "address"),
        ({"address": "020 7946 0958"}, "address"),
        ({"address": "+1 555"}, "address"),
        ({"address": "a@example.com", "reason": "spam"}, "reason"),
        ({"address": "a@example.com", "source_message_id": "msg-1"}, "source_message_id"),
        ({"address": "a@example.com", "note": "x"}, "note"),
        # A phone cannot bounce or complain; only a phone replies STOP.
        ({"address": "a@example.com", "reason": "sms_opt_out"}, "reason"),
        ({"address": "+14155550100", "reason": "bounce"}, "reason"),
        ({"address": "+14155550100", "reason": "complaint"}, "reason"),
    ]
    for body, field in refusals:
        message = assert_error(await client.post("/suppressions", json=body), 400, "BAD_REQUEST")
        assert field in message, body
    assert ok(await client.get("/suppressions"))["data"] == []


async def test_list_filter_get_delete(client: httpx.AsyncClient) -> None:
    bounce = await suppress(client, "bounce@example.com", reason="bounce")
    complaint = await suppress(client, "angry@example.org", reason="complaint")
    phone = await suppress(client, "+14155550100", reason="sms_opt_out")

    def addresses(listed: dict[str, Any]) -> list[str]:
        return [s["address"] for s in listed["data"]]

    everything = ok(await client.get("/suppressions"))
    assert addresses(everything) == [phone["address"], complaint["address"], bounce["address"]]
    assert addresses(ok(await client.get("/suppressions", params={"reason": "complaint"}))) == [
        "angry@example.org"
    ]
    assert addresses(ok(await client.get("/suppressions", params={"search": "EXAMPLE.O"}))) == [
        "angry@example.org"
    ]
    assert addresses(ok(await client.get("/suppressions", params={"search": "4155"}))) == [
        "+14155550100"
    ]
    assert ok(await client.get("/suppressions", params={"search": "%"}))["data"] == []
    paged = ok(await client.get("/suppressions", params={"limit": 1, "offset": 1}))
    assert addresses(paged) == ["angry@example.org"] and paged["has_more"] is True
    for params in ({"reason": "spam"}, {"search": ""}, {"limit": 0}):
        assert_error(await client.get("/suppressions", params=params), 400, "BAD_REQUEST")

    ok(await client.delete(f"/suppressions/{complaint['id']}"), 204)
    assert_error(await client.get(f"/suppressions/{complaint['id']}"), 404, "NOT_FOUND")
    assert_error(await client.delete(f"/suppressions/{complaint['id']}"), 404, "NOT_FOUND")
    # Lifted, the address can be suppressed again.
    await suppress(client, "angry@example.org")


async def test_suppressed_answers_for_many_addresses_at_once(
    client: httpx.AsyncClient, http: httpx.AsyncClient, service: Service, make_token: MakeToken
) -> None:
    first = await suppress(client, "Ada@Example.com", reason="complaint")
    await suppress(client, "+14155550100", reason="sms_opt_out")
    globex = await make_token(team="globex")
    ok(await http.post("/suppressions", json={"address": "grace@example.com"},
                       headers=globex.headers), 201)
    team_id = uuid.UUID(first["team_id"])
    asked = [
        "ada@example.com", "ADA@EXAMPLE.COM", "+14155550100", "grace@example.com",
        "+14155550101", "nobody@example.com",
    ]
    await suppress(client, "İz@example.com")
    dotted = await client.post("/suppressions", json={"address": "iz@example.com"})
    assert_error(dotted, 409, "CONFLICT")  # the same mailbox, as PostgreSQL folds it
    asked.append("İZ@example.com")
    async with service.db.acquire() as conn:
        found = await suppression_store.suppressed(conn, team_id, asked)
        assert found == {"ada@example.com", "ADA@EXAMPLE.COM", "+14155550100", "İZ@example.com"}
        assert await suppression_store.suppressed(conn, team_id, []) == set()
        many = [f"user{n}@example.com" for n in range(5000)] + ["ada@example.com"]
        assert await suppression_store.suppressed(conn, team_id, iter(many)) == {"ada@example.com"}
        assert await suppression_store.suppressed(conn, globex.team_id, asked) == {
            "grace@example.com"
        }


async def test_an_sms_opt_out_opts_the_teams_contacts_with_the_number_out(
    client: httpx.AsyncClient, http: httpx.AsyncClient, make_token: MakeToken
) -> None:
    """As the number's STOP does (docs/sms.md, Consent): source ``keyword``,
    stamped when the STOP was recorded, as a contact given the number later
    is. Another number, another team and a manual suppression are left be."""
    number, other = "+14155550140", "+14155550141"
    opted_in = await create(client, phone=number, sms_consent_status="opted_in")
    unknown = await create(client, phone="+1 415 555 0140")
    crm = await create(client, phone=number, sms_consent_status="opted_out",
                       sms_consent_source="crm")
    elsewhere = await create(client, phone=other, sms_consent_status="opted_in")
    globex = await make_token(team="globex")
    theirs = ok(await http.post("/contacts", headers=globex.headers, json={
        "phone": number, "sms_consent_status": "opted_in"}), 201)

    await suppress(client, other, reason="manual")
    stop = await suppress(client, "+1 (415) 555-0140", reason="sms_opt_out")
    assert stop["sms_opted_out_at"] is not None

    async def stamped(contact: dict[str, Any], headers: Any = None) -> tuple[Any, ...]:
        found = ok(await http.get(f"/contacts/{contact['id']}",
                                  headers=headers or client.headers))
        return (found["sms_consent_status"], found["sms_consent_source"],
                found["sms_consent_updated_at"])

    for contact in (opted_in, unknown):
        status, source, at = await stamped(contact)
        assert (status, source) == ("opted_out", "keyword")
        assert datetime.fromisoformat(at) == datetime.fromisoformat(stop["sms_opted_out_at"])
    assert await stamped(crm) == ("opted_out", "crm", crm["sms_consent_updated_at"])
    assert await stamped(elsewhere) == (
        "opted_in", "api", elsewhere["sms_consent_updated_at"])
    assert await stamped(theirs, globex.headers) == (
        "opted_in", "api", theirs["sms_consent_updated_at"])
    # And opted_in is refused until the number replies START, as after a STOP.
    refused = await client.patch(f"/contacts/{opted_in['id']}",
                                 json={"sms_consent_status": "opted_in"})
    assert "replied STOP" in assert_error(refused, 409, "CONFLICT")


async def test_an_sms_opt_out_of_a_number_suppressed_already_records_the_stop_on_it(
    client: httpx.AsyncClient,
) -> None:
    """A number suppressed by hand, then given in an opt-out list: the STOP
    is recorded on the suppression that stands (200), as the number's own
    reply would, so lifting the manual suppression later texts no one who
    opted out. A second opt-out is 409."""
    number = "+14155550150"
    contact = await create(client, phone=number, sms_consent_status="opted_in")
    manual = await suppress(client, number, reason="manual")
    answer = await client.post("/suppressions", json={"address": number,
                                                      "reason": "sms_opt_out"})
    stamped = ok(answer, 200)
    assert (stamped["id"], stamped["reason"]) == (manual["id"], "manual")
    assert stamped["sms_opted_out_at"] is not None
    found = ok(await client.get(f"/contacts/{contact['id']}"))
    assert (found["sms_consent_status"], found["sms_consent_source"]) == ("opted_out", "keyword")
    again = await client.post("/suppressions", json={"address": number, "reason": "sms_opt_out"})
    assert "suppressed already" in assert_error(again, 409, "CONFLICT")
    refused = await client.delete(f"/suppressions/{manual['id']}")
    assert "STOP" in assert_error(refused, 409, "CONFLICT")


async def test_an_sms_opt_out_meeting_a_phone_change_in_flight_opts_the_contact_out(
    client: httpx.AsyncClient, acme: Credential, database_url: str
) -> None:
    """The suppression takes the team's consent lock as a STOP does: it waits
    for a PATCH giving a contact the number, then opts that contact out."""
    contact = await create(client, phone=OTHER, sms_consent_status="opted_in")
    answer = await meanwhile(
        database_url, phone_change(acme.team_id, contact["id"], "opted_in"),
        lambda: client.post("/suppressions", json={"address": NUMBER, "reason": "sms_opt_out"}),
    )
    ok(answer, 201)
    assert await consent(client, contact["id"]) == ("opted_out", "keyword")
