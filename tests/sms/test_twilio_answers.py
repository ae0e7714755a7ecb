"""TIDINGS_SMS_PROVIDER=twilio against answers of the Twilio double that its
reference does not show: a huge or unreadable ``Retry-After``, a 2xx
without a message SID, text PostgreSQL cannot store, a fetch that is not a
message, and failures reported without a code. Each concerns one message;
the team's other messages in flight are sent once and recorded."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any
from uuid import UUID

import httpx
import pytest
import trio

from tests.conftest import assert_error
from tests.sms.helpers import event_types, ok, send, settled
from tests.sms.test_twilio import PUBLIC, callback, sent_through_twilio
from tests.sms.twilio_double import TwilioDouble, started, twilio_config
from tidings.config import Config
from tidings.service import Service

LONG_CODE = "+14155550100"
ODD = "+14155550177"  # the number whose sends the double answers oddly


@pytest.fixture
async def double(nursery: trio.Nursery) -> TwilioDouble:
    return await started(nursery, owned_numbers={LONG_CODE})


@pytest.fixture
def config(database_url: str, double: TwilioDouble) -> Config:
    return twilio_config(database_url, double, PUBLIC, sms_retry_schedule=(0.1, 0.1))


def answer(status: int, body: Any, **headers: str) -> tuple[int, bytes, dict[str, str]]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return status, raw, {"Content-Type": "application/json", **headers}


THROTTLED = {"code": 20429, "message": "Too Many Requests", "status": 429}


async def beside_others(
    client: httpx.AsyncClient, double: TwilioDouble, **odd: Any
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Four messages whose 201 the double holds for half a second, and
    then, while they are in flight, one to ODD with ``odd``. The odd
    message, and the others once each is submitted."""
    async def slowly(_sid: str) -> None:
        await trio.sleep(0.5)

    double.before_created = slowly
    ok(await client.post("/sender-ids", json={"value": LONG_CODE, "type": "long_code"}), 201)
    others = [await send(client, **{"from": LONG_CODE}, body=f"#{n}") for n in range(4)]
    sms = await send(client, **{"from": LONG_CODE}, to=ODD, body="odd", **odd)
    return sms, [await settled(client, other["id"], "submitted") for other in others]


def sent_bodies(double: TwilioDouble) -> list[str]:
    return sorted(form["Body"] for _at, form in double.sends)


async def test_a_huge_retry_after_holds_that_message_alone_for_a_day(
    client: httpx.AsyncClient, double: TwilioDouble, service: Service
) -> None:
    """999999999999 seconds are past the last date there is: the message
    waits a day, and the sends beside it are recorded, not cut short and
    sent again by an actor that crashed."""
    double.answers[ODD] = answer(429, THROTTLED, **{"Retry-After": "999999999999"})
    sms, others = await beside_others(client, double)
    await trio.sleep(0.5)
    assert sent_bodies(double) == ["#0", "#1", "#2", "#3", "odd"]
    assert all(other["message_id"] in double.messages for other in others)
    async with service.db.acquire() as conn:
        row = await conn.fetchrow(
            "SELECT status, attempt_count, lease_owner, next_attempt_at - now() AS wait"
            " FROM sms_messages WHERE id = $1", UUID(sms["id"]))
    assert (row["status"], row["attempt_count"], row["lease_owner"]) == ("processing", 1, None)
    assert timedelta(hours=23) < row["wait"] <= timedelta(days=1)
    assert [t.removeprefix("message.") for t in await event_types(client, sms["id"])] == [
        "queued", "processing",
    ]


async def test_a_retry_after_of_other_digits_is_not_a_wait(
    client: httpx.AsyncClient, double: TwilioDouble
) -> None:
    """``²`` is a digit to ``str.isdigit`` and not to ``int``: the message is
    retried on the schedule, then fails with Twilio's words, not Tidings'."""
    double.answers[ODD] = answer(429, THROTTLED, **{"Retry-After": "²"})
    sms, _others = await beside_others(client, double)
    failed = await settled(client, sms["id"], "failed")
    assert failed["failure"] == {"code": "20429", "message": "Too Many Requests"}
    assert sent_bodies(double) == ["#0", "#1", "#2", "#3", "odd", "odd", "odd"]


@pytest.mark.parametrize("body", [b"{not json", b"[1]", b'{"status": "queued"}'])
async def test_a_2xx_without_a_sid_is_unknown_and_never_sent_again(
    client: httpx.AsyncClient, double: TwilioDouble, body: bytes
) -> None:
    """Twilio took the message: it may be delivered, so it is not refused,
    and sending it again could text the person twice."""
    double.answers[ODD] = answer(201, body)
    sms, _others = await beside_others(client, double)
    unknown = await settled(client, sms["id"], "unknown")
    assert unknown["failure"]["code"] == "unreadable_answer"
    assert "could not be read" in unknown["failure"]["message"]
    assert unknown["message_id"] is None
    await trio.sleep(0.5)  # the schedule's retries would have come by now
    assert sent_bodies(double) == ["#0", "#1", "#2", "#3", "odd"]
    assert [t.removeprefix("message.") for t in await event_types(client, sms["id"])] == [
        "queued", "processing", "unknown",
    ]


async def test_a_nul_in_twilios_refusal_is_recorded_for_that_message_alone(
    client: httpx.AsyncClient, double: TwilioDouble
) -> None:
    """PostgreSQL's text holds no NUL: stored as Twilio said it, the refusal
    failed the transaction of its batch and the team's actor."""
    double.answers[ODD] = answer(
        400, b'{"code": 21211, "message": "Invalid \\u0000number", "status": 400}')
    sms, _others = await beside_others(client, double)
    rejected = await settled(client, sms["id"], "rejected")
    assert rejected["failure"] == {"code": "21211", "message": "Invalid \ufffdnumber"}
    await trio.sleep(0.5)
    assert sent_bodies(double) == ["#0", "#1", "#2", "#3", "odd"]


@pytest.mark.parametrize("body", [b"<html>oops", b"[1]", b'{"sid": "SM1"}'])
async def test_a_fetch_that_is_not_a_message_is_503_and_changes_nothing(
    client: httpx.AsyncClient, double: TwilioDouble, body: bytes
) -> None:
    sms = await sent_through_twilio(client)
    double.fetch_answers[sms["message_id"]] = (200, body, {"Content-Type": "text/html"})
    message = assert_error(await client.post(f"/sms/{sms['id']}/sync"), 503,
                           "SERVICE_UNAVAILABLE")
    assert "could not be read" in message
    assert ok(await client.get(f"/sms/{sms['id']}")) == sms
    assert [t.removeprefix("message.") for t in await event_types(client, sms["id"])] == [
        "queued", "processing", "submitted",
    ]


async def test_a_failure_reported_without_a_code_says_what_happened(
    client: httpx.AsyncClient, http: httpx.AsyncClient, double: TwilioDouble
) -> None:
    ok(await client.post("/sender-ids", json={"value": LONG_CODE, "type": "long_code"}), 201)

    async def submitted() -> dict[str, Any]:
        sms = await send(client, **{"from": LONG_CODE})
        return await settled(client, sms["id"], "submitted")

    for status in ("failed", "undelivered"):
        sms = await submitted()
        await callback(http, MessageSid=sms["message_id"], MessageStatus=status)
        found = ok(await client.get(f"/sms/{sms['id']}"))
        assert (found["last_event"], found["failure"]) == (
            status, {"code": status, "message": f"reported {status} by the provider"}
        )
    # The same from a sync.
    sms = await submitted()
    double.messages[sms["message_id"]]["status"] = "failed"
    synced = ok(await client.post(f"/sms/{sms['id']}/sync"))
    assert synced["failure"] == {"code": "failed", "message": "reported failed by the provider"}


async def test_unknown_says_why_until_the_message_moves_on(
    client: httpx.AsyncClient, http: httpx.AsyncClient
) -> None:
    sms = await sent_through_twilio(client)
    await callback(http, MessageSid=sms["message_id"], MessageStatus="bogus",
                   ErrorCode="30008")
    unknown = ok(await client.get(f"/sms/{sms['id']}"))
    assert (unknown["last_event"], unknown["failure"]) == (
        "unknown", {"code": "30008", "message": "Unknown error"}
    )
    await callback(http, MessageSid=sms["message_id"], MessageStatus="delivered")
    delivered = ok(await client.get(f"/sms/{sms['id']}"))
    assert (delivered["last_event"], delivered["failure"]) == ("delivered", None)


@pytest.mark.parametrize(("status", "headers", "retry_after"), [
    (429, {"Retry-After": "7"}, "7"),  # Twilio's own hint
    (429, {}, "5"),
    (503, {}, "5"),
])
async def test_a_sync_twilio_cannot_answer_now_says_when_to_retry(
    client: httpx.AsyncClient, double: TwilioDouble, status: int, headers: dict[str, str],
    retry_after: str,
) -> None:
    sms = await sent_through_twilio(client)
    double.fetch_answers[sms["message_id"]] = (
        status, b'{"code": 20429, "message": "Too Many Requests"}',
        {"Content-Type": "application/json", **headers},
    )
    response = await client.post(f"/sms/{sms['id']}/sync")
    assert_error(response, 503, "SERVICE_UNAVAILABLE")
    assert response.headers["Retry-After"] == retry_after
    assert ok(await client.get(f"/sms/{sms['id']}")) == sms
