"""The sandbox's whole life of a text message (CONTRACT §9) through the send
worker, every status move reaching a webhook receiver as ``message.<status>``
with channel ``sms``, and the consent model: STOP then send is 422, START
then send is 202."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import UUID, uuid4

import httpx
import pytest
import trio

from tests.conftest import assert_error
from tests.sms.helpers import NUMBER, event_types, later, ok, send, settled
from tests.webhooks.receiver import Receiver
from tidings.config import Config
from tidings.providers.sms import OutgoingSms
from tidings.providers.twilio import signature
from tidings.service import Service
from tidings.storage.sms_sending import Claimed, record_due_followups

TOKEN = "twilio-test-auth-token"
PUBLIC = "https://tidings.example"


@pytest.fixture
def config(database_url: str) -> Config:
    return Config(
        database_url=database_url, db_pool_size=6, rate_limit_per_second=0,
        shutdown_grace_seconds=2, webhook_allow_private_urls=True,
        webhook_poll_seconds=0.2, sms_poll_seconds=0.2,
        # The sandbox sends; Twilio's inbound webhook still takes START and HELP.
        twilio_auth_token=TOKEN, public_url=PUBLIC,
    )


async def inbound(http: httpx.AsyncClient, **form: str) -> httpx.Response:
    path = "/providers/twilio/inbound"
    sig = signature(TOKEN, PUBLIC + path, form.items())
    return await http.post(path, data=form, headers={"X-Twilio-Signature": sig})


async def test_each_number_gets_its_scripted_outcome(sms_client: httpx.AsyncClient) -> None:
    started = trio.current_time()
    cases = {
        NUMBER: ("delivered", ["queued", "processing", "submitted", "sent", "delivered"]),
        "+14155550001": ("undelivered",
                         ["queued", "processing", "submitted", "sent", "undelivered"]),
        "+14155550002": ("failed", ["queued", "processing", "submitted", "failed"]),
    }
    ids = {to: (await send(sms_client, to=to))["id"] for to in cases}
    for to, (status, expected) in cases.items():
        sms = await settled(sms_client, ids[to], status)
        assert [t.removeprefix("message.") for t in await event_types(sms_client, ids[to])] == (
            expected
        ), to
        assert sms["message_id"].startswith("sandbox-")
        assert sms["submitted_at"] is not None
    assert trio.current_time() - started < 8
    undelivered = ok(await sms_client.get(f"/sms/{ids['+14155550001']}"))
    assert undelivered["failure"]["code"] == "30003"
    assert undelivered["delivered_at"] is None
    delivered = ok(await sms_client.get(f"/sms/{ids[NUMBER]}"))
    assert delivered["failure"] is None and delivered["delivered_at"] is not None
    assert ok(await sms_client.get("/sms", params={"status": "undelivered"}))[0]["id"] == (
        ids["+14155550001"]
    )


async def test_every_move_reaches_a_webhook_receiver(
    sms_client: httpx.AsyncClient, nursery: trio.Nursery
) -> None:
    receiver = Receiver()
    await nursery.start(receiver.serve)
    ok(await sms_client.post("/webhook-endpoints", json={"url": receiver.url, "events": ["*"]}),
       201)
    sms = await send(sms_client)
    received = await receiver.wait_for(5)
    bodies = sorted((r.event for r in received), key=lambda e: e["occurred_at"])
    assert [b["event"] for b in bodies] == [
        "message.queued", "message.processing", "message.submitted", "message.sent",
        "message.delivered",
    ]
    for body in bodies:
        assert body["channel"] == "sms"
        assert body["message_id"] == sms["id"]
        assert body["to"] == NUMBER
        assert body["data"]["from"] == "Acme"
        # Every key of the documented data, null where it does not apply yet.
        assert set(body["data"]) == {"sms_id", "from", "to", "segments", "status",
                                      "provider_message_id", "code", "message"}
    assert bodies[0]["data"]["provider_message_id"] is None
    assert bodies[0]["data"]["code"] is None and bodies[0]["data"]["message"] is None
    assert bodies[-1]["data"]["provider_message_id"].startswith("sandbox-")


async def test_stop_then_send_is_422_and_start_then_send_is_202(
    sms_client: httpx.AsyncClient, http: httpx.AsyncClient
) -> None:
    stopper = "+14155550003"
    contact = ok(await sms_client.post("/contacts", json={"phone": stopper}), 201)
    first = await send(sms_client, to=stopper)
    await settled(sms_client, first["id"], "delivered")
    with trio.fail_after(10):
        while True:
            found = ok(await sms_client.get(f"/contacts/{contact['id']}"))
            if found["sms_consent_status"] == "opted_out":
                break
            await trio.sleep(0.05)
    assert found["sms_consent_source"] == "keyword"
    suppressions = ok(await sms_client.get("/suppressions"))["data"]
    assert [(s["address"], s["kind"], s["reason"]) for s in suppressions] == [
        (stopper, "phone", "sms_opt_out")
    ]
    refused = await sms_client.post("/sms", json={"to": stopper, "from": "Acme", "body": "x"})
    assert "opted out" in assert_error(refused, 422, "UNPROCESSABLE_ENTITY")

    # START, sent to the team's number, opts back in.
    ok(await sms_client.post("/sender-ids", json={"value": "+14155550100",
                                                  "type": "long_code"}), 201)
    answer = await inbound(http, From=stopper, To="+14155550100", Body=" start ",
                           MessageSid="SM1")
    assert answer.status_code == 200 and "<Response>" in answer.text
    assert ok(await sms_client.get(f"/contacts/{contact['id']}"))["sms_consent_status"] == (
        "opted_in"
    )
    assert ok(await sms_client.get("/suppressions"))["data"] == []
    await send(sms_client, to=stopper)


async def test_stop_without_a_contact_is_a_phone_suppression(
    sms_client: httpx.AsyncClient, http: httpx.AsyncClient
) -> None:
    ok(await sms_client.post("/sender-ids", json={"value": "+14155550100",
                                                  "type": "long_code"}), 201)
    for n, word in enumerate(("STOP", "stopall", "Unsubscribe.", "cancel", "END", "quit")):
        await inbound(http, From=NUMBER, To="+14155550100", Body="START", MessageSid=f"SMa{n}")
        await send(sms_client)
        answer = await inbound(http, From=NUMBER, To="+14155550100", Body=word,
                               MessageSid=f"SMb{n}")
        assert answer.status_code == 200
        refused = await sms_client.post("/sms", json={"to": NUMBER, "from": "Acme", "body": "x"})
        assert_error(refused, 422, "UNPROCESSABLE_ENTITY")
    # A number given without its "+" is the same sender ID.
    await inbound(http, From=NUMBER, To="+14155550100", Body="START", MessageSid="SM0")
    await inbound(http, From=NUMBER, To="14155550100", Body="STOP", MessageSid="SM5")
    refused = await sms_client.post("/sms", json={"to": NUMBER, "from": "Acme", "body": "x"})
    assert_error(refused, 422, "UNPROCESSABLE_ENTITY")
    # A sentence is not a keyword.
    await inbound(http, From=NUMBER, To="+14155550100", Body="please stop it", MessageSid="SM2")
    assert_error(await sms_client.post("/sms", json={"to": NUMBER, "from": "Acme", "body": "x"}),
                 422, "UNPROCESSABLE_ENTITY")


async def test_a_stop_outlasts_any_suppression_of_the_number_until_start(
    sms_client: httpx.AsyncClient, http: httpx.AsyncClient
) -> None:
    """A number suppressed by hand that replies STOP stays opted out when the
    team lifts its suppression; a STOP's own suppression cannot be lifted by
    the team at all. Only START ends the opt-out (a manual suppression then
    stays until lifted)."""
    ok(await sms_client.post("/sender-ids", json={"value": "+14155550100",
                                                  "type": "long_code"}), 201)
    manual = ok(await sms_client.post("/suppressions", json={"address": NUMBER}), 201)
    await inbound(http, From=NUMBER, To="+14155550100", Body="STOP", MessageSid="SM6")
    lifted = await sms_client.delete(f"/suppressions/{manual['id']}")
    assert "replied STOP" in assert_error(lifted, 409, "CONFLICT")
    refused = await sms_client.post("/sms", json={"to": NUMBER, "from": "Acme", "body": "x"})
    assert_error(refused, 422, "UNPROCESSABLE_ENTITY")

    await inbound(http, From=NUMBER, To="+14155550100", Body="START", MessageSid="SM7")
    assert [s["reason"] for s in ok(await sms_client.get("/suppressions"))["data"]] == ["manual"]
    assert (await sms_client.delete(f"/suppressions/{manual['id']}")).status_code == 204
    await send(sms_client)

    other = "+14155550177"
    await inbound(http, From=other, To="+14155550100", Body="STOP", MessageSid="SM8")
    [stop] = ok(await sms_client.get("/suppressions"))["data"]
    assert (stop["address"], stop["reason"]) == (other, "sms_opt_out")
    assert stop["sms_opted_out_at"] is not None  # the list says which are STOPs
    assert_error(await sms_client.delete(f"/suppressions/{stop['id']}"), 409, "CONFLICT")
    assert_error(await sms_client.post("/sms", json={"to": other, "from": "Acme", "body": "x"}),
                 422, "UNPROCESSABLE_ENTITY")
    # One made by the team with that reason (an opt-out list brought from
    # elsewhere) records a STOP as well: only the number's START lifts it.
    brought = "+14155550178"
    made = ok(await sms_client.post("/suppressions", json={
        "address": brought, "reason": "sms_opt_out"}), 201)
    assert made["sms_opted_out_at"] is not None
    assert_error(await sms_client.delete(f"/suppressions/{made['id']}"), 409, "CONFLICT")
    await inbound(http, From=brought, To="+14155550100", Body="START", MessageSid="SM11")
    assert_error(await sms_client.get(f"/suppressions/{made['id']}"), 404, "NOT_FOUND")
    manual_again = ok(await sms_client.post("/suppressions", json={"address": brought}), 201)
    assert manual_again["sms_opted_out_at"] is None


async def test_a_contact_of_a_number_that_replied_stop_is_opted_out(
    sms_client: httpx.AsyncClient, http: httpx.AsyncClient
) -> None:
    """Contacts made or given the number after its STOP say what sending will
    do: ``opted_out`` (source ``keyword``); ``opted_in`` is 409 until START."""
    ok(await sms_client.post("/sender-ids", json={"value": "+14155550100",
                                                  "type": "long_code"}), 201)
    await inbound(http, From=NUMBER, To="+14155550100", Body="STOP", MessageSid="SM9")
    later_contact = ok(await sms_client.post("/contacts", json={"phone": NUMBER}), 201)
    assert (later_contact["sms_consent_status"], later_contact["sms_consent_source"]) == (
        "opted_out", "keyword")
    assert later_contact["sms_consent_updated_at"] is not None
    refused = await sms_client.post("/contacts", json={
        "phone": NUMBER, "email": "x@example.org", "sms_consent_status": "opted_in"})
    assert "sms_consent_status" in assert_error(refused, 409, "CONFLICT")
    patched = await sms_client.patch(f"/contacts/{later_contact['id']}",
                                     json={"sms_consent_status": "opted_in"})
    assert "replied STOP" in assert_error(patched, 409, "CONFLICT")
    moved = ok(await sms_client.post("/contacts", json={
        "phone": "+14155550188", "sms_consent_status": "opted_in"}), 201)
    moved = ok(await sms_client.patch(f"/contacts/{moved['id']}", json={"phone": NUMBER}))
    assert (moved["sms_consent_status"], moved["sms_consent_source"]) == ("opted_out", "keyword")
    # Another contact's change leaves these alone; START opts them all in.
    await inbound(http, From=NUMBER, To="+14155550100", Body="START", MessageSid="SM10")
    back = ok(await sms_client.get(f"/contacts/{later_contact['id']}"))
    assert back["sms_consent_status"] == "opted_in"
    ok(await sms_client.patch(f"/contacts/{moved['id']}", json={"sms_consent_status": "opted_in"}))


async def test_help_answers_with_the_help_text_naming_the_team(
    sms_client: httpx.AsyncClient, http: httpx.AsyncClient
) -> None:
    ok(await sms_client.post("/sender-ids", json={"value": "+14155550100",
                                                  "type": "long_code"}), 201)
    answer = await inbound(http, From=NUMBER, To="+14155550100", Body="help", MessageSid="SM3")
    assert answer.headers["content-type"].startswith("text/xml")
    assert "<Message>acme: reply STOP" in answer.text
    await send(sms_client)  # HELP changes no consent


async def test_a_message_to_a_number_that_opted_out_after_acceptance_fails(
    sms_client: httpx.AsyncClient, http: httpx.AsyncClient
) -> None:
    ok(await sms_client.post("/sender-ids", json={"value": "+14155550100",
                                                  "type": "long_code"}), 201)
    scheduled = await send(sms_client, scheduled_at=later(seconds=1))
    await inbound(http, From=NUMBER, To="+14155550100", Body="STOP", MessageSid="SM4")
    failed = await settled(sms_client, scheduled["id"], "failed")
    assert failed["failure"]["code"] == "opted_out"



async def test_a_reply_to_an_alphanumeric_sender_id_belongs_to_no_team(
    sms_client: httpx.AsyncClient, http: httpx.AsyncClient
) -> None:
    """Several teams may hold the name ``Acme``, and nobody can reply to a
    name: a STOP "to" it opts the number out of no team's messages."""
    answer = await inbound(http, From=NUMBER, To="Acme", Body="STOP", MessageSid="SM12")
    assert answer.status_code == 200
    assert ok(await sms_client.get("/suppressions"))["data"] == []
    await send(sms_client)  # still 202: the number did not opt out of acme


async def test_events_of_one_moment_are_listed_newest_first(
    sms_client: httpx.AsyncClient,
) -> None:
    """Events recorded in one transaction share ``created_at``; the list
    still gives them newest first, as they happened, not by their ids."""
    ids = [(await send(sms_client))["id"] for _ in range(6)]
    for sms_id in ids:
        await settled(sms_client, sms_id, "delivered")
    listed = ok(await sms_client.get("/events", params={"limit": 100}))["data"]
    lifecycle = ["queued", "processing", "submitted", "sent", "delivered"]
    for sms_id in ids:
        mine = [e["type"].removeprefix("message.") for e in listed if e["message_id"] == sms_id]
        assert mine == lifecycle[::-1], (sms_id, mine)


async def test_statuses_falling_due_together_are_applied_in_the_order_they_fell_due(
    sms_client: httpx.AsyncClient, service: Service
) -> None:
    """A drain that finds ``sent`` and ``delivered`` both due (after a
    restart, or running late) records both: the rows come out of their
    table in any order, and a ``sent`` after ``delivered`` would be dropped."""
    sms = await send(sms_client, scheduled_at=later(hours=1))
    insert = (
        "INSERT INTO sms_followups (sms_id, kind, status, provider, due_at) "
        "VALUES ($1, 'status', $2, 'sandbox', now() - $3 * interval '1 second')"
    )
    async with service.db.transaction() as conn:
        # Stored latest first, as a table reusing its free space may hold them.
        for status, ago in (("delivered", 1), ("sent", 2), ("submitted", 3)):
            await conn.execute(insert, UUID(sms["id"]), status, ago)
        taken, _ = await record_due_followups(conn, 100)
    assert taken == 3
    assert await event_types(sms_client, sms["id"]) == [  # by when they happened
        "message.submitted", "message.sent", "message.delivered", "message.queued"
    ]


async def test_an_attempts_own_statuses_carry_the_time_of_its_answer(service: Service) -> None:
    """Recorded late (a stalled or restarting process), ``submitted`` still
    comes before the ``sent`` and ``delivered`` that fall due from the
    answer: it carries the answer's time, not the recording's."""
    side = service.sms
    claimed = Claimed(
        id=uuid4(), team_id=uuid4(), to_number=NUMBER, from_sender="Acme", body="Hi",
        status="processing", attempt_count=0, send_begun_at=None, sender_ok=True,
        opted_out=False,
    )
    before = datetime.now(UTC)
    result = await side.provider.send(OutgoingSms(
        message_id=claimed.id, team_id=claimed.team_id, to=NUMBER, sender="Acme", body="Hi"))
    attempted = side._finish(claimed, result, [])
    assert [r.status for r in attempted.reports] == ["submitted"]
    stamped = [r.occurred_at for r in attempted.reports]
    assert all(at is not None and at >= before for at in stamped), stamped
    assert max(at for at in stamped if at) < min(f.due_at for f in attempted.followups)


async def test_a_reply_sent_again_or_replayed_changes_consent_once(
    sms_client: httpx.AsyncClient, http: httpx.AsyncClient
) -> None:
    # Twilio sends a webhook again when its answer is lost, and a signature
    # has no time in it: a START copied from the wire and replayed after the
    # number's later STOP must not opt it back in.
    ok(await sms_client.post("/sender-ids", json={"value": "+14155550100",
                                                  "type": "long_code"}), 201)
    start = {"From": NUMBER, "To": "+14155550100", "Body": "START", "MessageSid": "SMstart"}
    stop = {"From": NUMBER, "To": "+14155550100", "Body": "STOP", "MessageSid": "SMstop"}
    assert (await inbound(http, **stop)).status_code == 200
    assert (await inbound(http, **start)).status_code == 200
    await send(sms_client)  # opted back in
    assert (await inbound(http, **stop | {"MessageSid": "SMstop2"})).status_code == 200
    replayed = await inbound(http, **start)
    assert replayed.status_code == 200 and "<Response>" in replayed.text
    refused = await sms_client.post("/sms", json={"to": NUMBER, "from": "Acme", "body": "x"})
    assert_error(refused, 422, "UNPROCESSABLE_ENTITY")
    [suppression] = ok(await sms_client.get("/suppressions"))["data"]
    assert suppression["reason"] == "sms_opt_out"
    # And a STOP replayed after a START does not opt the number out again.
    assert (await inbound(http, **start | {"MessageSid": "SMstart2"})).status_code == 200
    assert (await inbound(http, **stop)).status_code == 200
    await send(sms_client)


async def test_a_reply_whose_sid_is_no_twilio_sid_is_applied_without_being_kept(
    sms_client: httpx.AsyncClient, http: httpx.AsyncClient
) -> None:
    ok(await sms_client.post("/sender-ids", json={"value": "+14155550100",
                                                  "type": "long_code"}), 201)
    long_sid = "SM" + "a1" * 4500  # signed, but far longer than Twilio's 34 characters
    stop = {"From": NUMBER, "To": "+14155550100", "Body": "STOP", "MessageSid": long_sid}
    assert (await inbound(http, **stop)).status_code == 200
    refused = await sms_client.post("/sms", json={"to": NUMBER, "from": "Acme", "body": "x"})
    assert_error(refused, 422, "UNPROCESSABLE_ENTITY")
    start = {**stop, "Body": "START", "MessageSid": "", "SmsSid": long_sid}
    assert (await inbound(http, **start)).status_code == 200
    await send(sms_client)
