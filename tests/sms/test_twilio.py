"""TIDINGS_SMS_PROVIDER=twilio against the Twilio double: send, status
callbacks with a valid and an invalid signature, callbacks that come before
the message's SID is stored, sync, 429 with Retry-After, a refused message,
a cancel by Twilio, and sender ID review."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import httpx
import pytest
import trio

from tests.conftest import assert_error
from tests.sms.helpers import NUMBER, event_types, ok, send, settled
from tests.sms.twilio_double import ACCOUNT_SID, AUTH_TOKEN, TwilioDouble, started, twilio_config
from tidings.actors.retention import early_sms_report_sweep
from tidings.config import Config
from tidings.providers.twilio import signature
from tidings.service import Service

PUBLIC = "https://tidings.example"
STATUS = "/providers/twilio/status"


@pytest.fixture
async def double(nursery: trio.Nursery) -> TwilioDouble:
    return await started(nursery, owned_numbers={"+14155550100"}, owned_short_codes={"55555"})


@pytest.fixture
def config(database_url: str, double: TwilioDouble) -> Config:
    return twilio_config(database_url, double, PUBLIC, sms_retry_schedule=(0.1, 0.1),
                         sender_id_review_seconds=0.2)


async def callback(http: httpx.AsyncClient, *, valid: bool = True, **form: str) -> httpx.Response:
    sig = signature(AUTH_TOKEN if valid else "wrong-token", PUBLIC + STATUS, form.items())
    return await http.post(STATUS, data=form, headers={"X-Twilio-Signature": sig})


async def test_sender_ids_are_reviewed_by_the_account(client: httpx.AsyncClient) -> None:
    cases = [("Acme", "alphanumeric", "approved"), ("+14155550100", "long_code", "approved"),
             ("+14155550199", "long_code", "rejected"), ("55555", "short_code", "approved"),
             ("66666", "short_code", "rejected")]
    for value, type, status in cases:
        created = ok(await client.post("/sender-ids", json={"value": value, "type": type}), 201)
        assert created["status"] == status, value
    refused = await client.post("/sms", json={"to": NUMBER, "from": "+14155550199", "body": "x"})
    assert "rejected" in assert_error(refused, 422, "UNPROCESSABLE_ENTITY")


async def test_a_sender_id_left_pending_by_an_outage_is_decided_when_twilio_answers(
    client: httpx.AsyncClient, double: TwilioDouble
) -> None:
    double.numbers_unavailable = True
    owned = ok(await client.post(
        "/sender-ids", json={"value": "+14155550100", "type": "long_code"}), 201)
    foreign = ok(await client.post("/sender-ids", json={"value": "66666", "type": "short_code"}),
                 201)
    assert (owned["status"], foreign["status"]) == ("pending", "pending")
    refused = await client.post("/sms", json={"to": NUMBER, "from": "+14155550100", "body": "x"})
    assert "pending" in assert_error(refused, 422, "UNPROCESSABLE_ENTITY")
    await trio.sleep(0.7)  # asked again every 0.2 s meanwhile, and still no answer
    assert ok(await client.get(f"/sender-ids/{owned['id']}"))["status"] == "pending"
    assert 2 <= double.lookups.count("+14155550100") <= 6
    double.numbers_unavailable = False
    with trio.fail_after(10):
        while ok(await client.get(f"/sender-ids/{owned['id']}"))["status"] == "pending":
            await trio.sleep(0.05)
    assert ok(await client.get(f"/sender-ids/{owned['id']}"))["status"] == "approved"
    with trio.fail_after(10):
        while ok(await client.get(f"/sender-ids/{foreign['id']}"))["status"] == "pending":
            await trio.sleep(0.05)
    assert ok(await client.get(f"/sender-ids/{foreign['id']}"))["status"] == "rejected"
    await send(client, **{"from": "+14155550100"})


async def sent_through_twilio(client: httpx.AsyncClient, **fields: Any) -> dict[str, Any]:
    ok(await client.post("/sender-ids", json={"value": "+14155550100", "type": "long_code"}), 201)
    sms = await send(client, **{"from": "+14155550100"}, **fields)
    return await settled(client, sms["id"], "submitted")


async def test_send_posts_the_form_with_basic_auth_and_the_status_callback(
    client: httpx.AsyncClient, double: TwilioDouble
) -> None:
    sms = await sent_through_twilio(client, body="Hi €")
    assert sms["message_id"] in double.messages
    (_at, form), = double.sends
    assert form == {"To": NUMBER, "From": "+14155550100", "Body": "Hi €",
                    "StatusCallback": f"{PUBLIC}{STATUS}?sms={sms['id']}"}
    assert [t.removeprefix("message.") for t in await event_types(client, sms["id"])] == [
        "queued", "processing", "submitted",
    ]


async def test_status_callbacks_are_verified_and_move_forward_only(
    client: httpx.AsyncClient, http: httpx.AsyncClient
) -> None:
    sms = await sent_through_twilio(client)
    sid = sms["message_id"]
    forged = await callback(http, valid=False, MessageSid=sid, MessageStatus="delivered")
    assert_error(forged, 403, "FORBIDDEN")
    unsigned = await http.post(STATUS, data={"MessageSid": sid, "MessageStatus": "delivered"})
    assert_error(unsigned, 403, "FORBIDDEN")
    assert ok(await client.get(f"/sms/{sms['id']}"))["last_event"] == "submitted"

    for status in ("sent", "delivered", "sent", "undelivered"):
        answer = await callback(http, MessageSid=sid, MessageStatus=status, AccountSid=ACCOUNT_SID)
        assert answer.status_code == 200
    final = ok(await client.get(f"/sms/{sms['id']}"))
    assert final["last_event"] == "delivered" and final["delivered_at"] is not None
    moments = {name: datetime.fromisoformat(final[name])
               for name in ("created_at", "submitted_at", "delivered_at", "updated_at")}
    assert moments["updated_at"] >= max(moments.values()), moments
    assert [t.removeprefix("message.") for t in await event_types(client, sms["id"])] == [
        "queued", "processing", "submitted", "sent", "delivered",
    ]
    # A tampered parameter breaks the signature.
    form = {"MessageSid": sid, "MessageStatus": "failed"}
    sig = signature(AUTH_TOKEN, PUBLIC + STATUS, form.items())
    tampered = await http.post(STATUS, data={**form, "ErrorCode": "30007"},
                               headers={"X-Twilio-Signature": sig})
    assert_error(tampered, 403, "FORBIDDEN")
    # A signature that is not even ASCII is one that does not match.
    for path in (STATUS, "/providers/twilio/inbound"):
        odd = await http.post(path, data=form, headers=[(b"X-Twilio-Signature", b"\xc3\xa9abc")])
        assert_error(odd, 403, "FORBIDDEN")


async def test_unknown_between_callbacks_never_takes_a_message_back(
    client: httpx.AsyncClient, http: httpx.AsyncClient
) -> None:
    sms = await sent_through_twilio(client)
    # "bogus" is a status Tidings does not know: unknown. "queued" is submitted.
    for status in ("sent", "bogus", "queued", "bogus", "queued", "sent"):
        answer = await callback(http, MessageSid=sms["message_id"], MessageStatus=status)
        assert answer.status_code == 200
    assert ok(await client.get(f"/sms/{sms['id']}"))["last_event"] == "unknown"
    # Each callback is recorded in its own transaction: the furthest status
    # reached before unknown is read back from the message's events.
    await callback(http, MessageSid=sms["message_id"], MessageStatus="delivered")
    assert ok(await client.get(f"/sms/{sms['id']}"))["last_event"] == "delivered"
    assert [t.removeprefix("message.") for t in await event_types(client, sms["id"])] == [
        "queued", "processing", "submitted", "sent", "unknown", "delivered",
    ]


async def test_a_failure_callback_records_the_code(
    client: httpx.AsyncClient, http: httpx.AsyncClient
) -> None:
    sms = await sent_through_twilio(client)
    await callback(http, MessageSid=sms["message_id"], MessageStatus="undelivered",
                   ErrorCode="30003")
    found = ok(await client.get(f"/sms/{sms['id']}"))
    assert found["last_event"] == "undelivered"
    # The callback carries only the code: the message is Twilio's word for it.
    assert found["failure"] == {"code": "30003", "message": "Unreachable destination handset"}
    other = await settled(client, (await send(client, **{"from": "+14155550100"}))["id"],
                          "submitted")
    await callback(http, MessageSid=other["message_id"], MessageStatus="failed",
                   ErrorCode="21999", ErrorMessage="Something Twilio said")
    assert ok(await client.get(f"/sms/{other['id']}"))["failure"] == {
        "code": "21999", "message": "Something Twilio said"
    }


async def test_callbacks_before_the_sid_is_stored_are_kept_and_applied(
    client: httpx.AsyncClient, http: httpx.AsyncClient, double: TwilioDouble, service: Service
) -> None:
    answers: list[Any] = []

    async def call_back_first(sid: str) -> None:
        # Twilio's callbacks overtake its 201: the worker has no SID to match.
        for status in ("sent", "delivered"):
            answers.append(ok(await callback(http, MessageSid=sid, MessageStatus=status)))

    double.before_created = call_back_first
    ok(await client.post("/sender-ids", json={"value": "+14155550100", "type": "long_code"}), 201)
    sms = await send(client, **{"from": "+14155550100"})
    delivered = await settled(client, sms["id"], "delivered")
    assert answers == [{"recorded": 0, "kept": True}] * 2
    assert delivered["message_id"] in double.messages
    assert datetime.fromisoformat(delivered["submitted_at"]) <= datetime.fromisoformat(
        delivered["delivered_at"])
    assert [t.removeprefix("message.") for t in await event_types(client, sms["id"])] == [
        "queued", "processing", "submitted", "sent", "delivered",
    ]
    async with service.db.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM sms_early_reports") == 0


async def test_callbacks_racing_the_worker_are_never_lost(
    client: httpx.AsyncClient, http: httpx.AsyncClient, double: TwilioDouble,
    nursery: trio.Nursery,
) -> None:
    async def call_back(sid: str) -> None:
        for status in ("sent", "delivered"):
            assert (await callback(http, MessageSid=sid, MessageStatus=status)).status_code == 200

    async def call_back_at_once(sid: str) -> None:
        nursery.start_soon(call_back, sid)  # as the 201 goes out

    double.before_created = call_back_at_once
    ok(await client.post("/sender-ids", json={"value": "+14155550100", "type": "long_code"}), 201)
    sent = [await send(client, **{"from": "+14155550100"}) for _ in range(20)]
    for sms in sent:
        await settled(client, sms["id"], "delivered")
    listed = ok(await client.get("/events", params={"limit": 100}))["data"]
    for sms in sent:
        assert sorted(e["type"] for e in listed if e["message_id"] == sms["id"]) == sorted(
            f"message.{s}" for s in ("queued", "processing", "submitted", "sent", "delivered")
        )


async def test_a_callback_kept_while_the_sid_is_being_stored_is_applied(
    client: httpx.AsyncClient, http: httpx.AsyncClient, double: TwilioDouble, service: Service,
    nursery: trio.Nursery,
) -> None:
    """The callback looks the SID up before the worker stores it, and keeps
    its report only after the worker has looked for kept reports: it is the
    callback's second look that applies it."""
    locked, release = trio.Event(), trio.Event()
    answers: list[Any] = []

    async def hold_inserts() -> None:
        async with service.db.transaction() as conn:
            await conn.execute("LOCK TABLE sms_early_reports IN EXCLUSIVE MODE")  # reads pass
            locked.set()
            await release.wait()

    async def post(sid: str) -> None:
        answers.append(ok(await callback(http, MessageSid=sid, MessageStatus="delivered")))

    async def call_back_held(sid: str) -> None:
        nursery.start_soon(hold_inserts)
        await locked.wait()
        nursery.start_soon(post, sid)
        async with service.db.acquire() as conn:
            with trio.fail_after(10):
                while not await conn.fetchval(
                    "SELECT count(*) FROM pg_locks"
                    " WHERE relation = 'sms_early_reports'::regclass AND NOT granted"
                ):
                    await trio.sleep(0.01)

    double.before_created = call_back_held
    ok(await client.post("/sender-ids", json={"value": "+14155550100", "type": "long_code"}), 201)
    sms = await send(client, **{"from": "+14155550100"})
    await settled(client, sms["id"], "submitted")
    await trio.sleep(0.3)  # the worker has looked for kept reports, and found none
    release.set()
    await settled(client, sms["id"], "delivered")
    assert answers == [{"recorded": 1, "kept": False}]


async def test_a_callback_that_never_matches_is_kept_then_removed_by_retention(
    client: httpx.AsyncClient, http: httpx.AsyncClient, config: Config, service: Service
) -> None:
    answer = await callback(http, MessageSid="SM" + "0" * 32, MessageStatus="delivered")
    assert ok(answer) == {"recorded": 0, "kept": True}
    sweep = early_sms_report_sweep(config)
    async with service.db.acquire() as conn:
        assert await sweep.delete(service.db) == 0  # a day to match
        assert await conn.fetchval("SELECT count(*) FROM sms_early_reports") == 1
        await conn.execute("UPDATE sms_early_reports SET received_at = now() - interval '25h'")
        assert await sweep.delete(service.db) == 1
        assert await conn.fetchval("SELECT count(*) FROM sms_early_reports") == 0


async def test_a_report_left_behind_is_applied_by_the_retention_sweep(
    client: httpx.AsyncClient, config: Config, service: Service
) -> None:
    sms = await sent_through_twilio(client)
    async with service.db.acquire() as conn:
        # As if the worker had stopped between storing the SID and applying
        # the report a callback kept meanwhile.
        await conn.execute(
            "INSERT INTO sms_early_reports (message_id, provider, status, received_at)"
            " VALUES ($1, 'twilio', 'delivered', now() - interval '2 minutes')",
            sms["message_id"],
        )
        assert await early_sms_report_sweep(config).delete(service.db) == 0  # none deleted
        assert await conn.fetchval("SELECT count(*) FROM sms_early_reports") == 0
    assert ok(await client.get(f"/sms/{sms['id']}"))["last_event"] == "delivered"


async def test_a_cancel_by_twilio_records_a_failure(
    client: httpx.AsyncClient, http: httpx.AsyncClient, double: TwilioDouble
) -> None:
    by_twilio = {"code": "canceled", "message": "canceled by the provider"}
    sms = await sent_through_twilio(client)
    await callback(http, MessageSid=sms["message_id"], MessageStatus="canceled")
    found = ok(await client.get(f"/sms/{sms['id']}"))
    assert (found["last_event"], found["failure"]) == ("canceled", by_twilio)
    other = await settled(client, (await send(client, **{"from": "+14155550100"}))["id"],
                          "submitted")
    double.messages[other["message_id"]]["status"] = "canceled"
    synced = ok(await client.post(f"/sms/{other['id']}/sync"))
    assert (synced["last_event"], synced["failure"]) == ("canceled", by_twilio)
    # Twilio's own words, when it gives them, are kept.
    third = await settled(client, (await send(client, **{"from": "+14155550100"}))["id"],
                          "submitted")
    await callback(http, MessageSid=third["message_id"], MessageStatus="canceled",
                   ErrorCode="30008")
    assert ok(await client.get(f"/sms/{third['id']}"))["failure"] == {
        "code": "30008", "message": "Unknown error",
    }


async def test_a_signed_callback_with_a_nul_is_400(
    client: httpx.AsyncClient, http: httpx.AsyncClient
) -> None:
    answer = await callback(http, MessageSid="SM\x00", MessageStatus="delivered")
    assert "MessageSid" in assert_error(answer, 400, "BAD_REQUEST")
    answer = await callback(http, MessageSid="SM1", MessageStatus="delivered\x00")
    assert "MessageStatus" in assert_error(answer, 400, "BAD_REQUEST")


async def test_sync_fetches_the_message(client: httpx.AsyncClient, double: TwilioDouble) -> None:
    sms = await sent_through_twilio(client)
    double.messages[sms["message_id"]]["status"] = "sent"
    assert ok(await client.post(f"/sms/{sms['id']}/sync"))["last_event"] == "sent"
    double.messages[sms["message_id"]].update(status="failed", error_code=30007,
                                              error_message="Carrier violation")
    synced = ok(await client.post(f"/sms/{sms['id']}/sync"))
    assert synced["last_event"] == "failed"
    assert synced["failure"] == {"code": "30007", "message": "Carrier violation"}


async def test_429_is_retried_after_retry_after(
    client: httpx.AsyncClient, double: TwilioDouble
) -> None:
    double.throttle_next = 1
    sms = await sent_through_twilio(client)
    first, second = double.sends
    assert second[0] - first[0] >= 1.0  # Retry-After: 1, longer than the schedule's 0.1
    assert [t.removeprefix("message.") for t in await event_types(client, sms["id"])] == [
        "queued", "processing", "submitted",
    ]


async def test_throttled_past_the_schedule_fails(
    client: httpx.AsyncClient, double: TwilioDouble
) -> None:
    double.throttle_next = 10
    ok(await client.post("/sender-ids", json={"value": "+14155550100", "type": "long_code"}), 201)
    sms = await send(client, **{"from": "+14155550100"})
    failed = await settled(client, sms["id"], "failed", within=15)
    assert failed["failure"]["code"] == "20429"
    assert len(double.sends) == 3  # the first attempt and the schedule's two retries


async def test_a_refused_message_is_rejected_with_twilios_code(client: httpx.AsyncClient) -> None:
    ok(await client.post("/sender-ids", json={"value": "+14155550100", "type": "long_code"}), 201)
    contact = ok(await client.post("/contacts", json={
        "phone": "+14155559999", "sms_consent_status": "opted_in"}), 201)
    sms = await send(client, **{"from": "+14155550100"}, to="+14155559999")
    rejected = await settled(client, sms["id"], "rejected")
    assert rejected["failure"] == {
        "code": "21610", "message": "Attempt to send to unsubscribed recipient",
    }
    # Twilio refuses a number that opted out with it: that is its STOP here too.
    [stop] = ok(await client.get("/suppressions", params={"search": "14155559999"}))["data"]
    assert (stop["reason"], stop["source_message_id"]) == ("sms_opt_out", sms["id"])
    assert stop["sms_opted_out_at"] is not None
    found = ok(await client.get(f"/contacts/{contact['id']}"))
    assert (found["sms_consent_status"], found["sms_consent_source"]) == ("opted_out", "keyword")
    again = await client.post("/sms", json={"from": "+14155550100", "to": "+14155559999",
                                            "body": "hi"})
    assert_error(again, 422, "UNPROCESSABLE_ENTITY")


async def test_twilios_opt_out_type_names_the_keyword(
    client: httpx.AsyncClient, http: httpx.AsyncClient
) -> None:
    """With Advanced Opt-Out, Twilio names a reply it took for STOP (ARRET,
    in French) in OptOutType: that is the STOP, whatever the body says."""
    ok(await client.post("/sender-ids", json={"value": "+14155550100", "type": "long_code"}), 201)
    path = "/providers/twilio/inbound"

    async def reply(**form: str) -> None:
        form = {"From": "+14155550123", "To": "+14155550100", **form}
        headers = {"X-Twilio-Signature": signature(AUTH_TOKEN, PUBLIC + path, form.items())}
        assert (await http.post(path, data=form, headers=headers)).status_code == 200

    await reply(Body="ARRET", OptOutType="STOP")
    [stop] = ok(await client.get("/suppressions", params={"search": "14155550123"}))["data"]
    assert stop["reason"] == "sms_opt_out"
    await reply(Body="Commencer", OptOutType="START")
    assert ok(await client.get("/suppressions", params={"search": "14155550123"}))["data"] == []
    await reply(Body="ARRET")  # without Advanced Opt-Out: not a keyword of Tidings'
    assert ok(await client.get("/suppressions", params={"search": "14155550123"}))["data"] == []
