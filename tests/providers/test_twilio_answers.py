"""Twilio's answers that are not what its reference shows, read by the
provider over real HTTP from the Twilio double: a ``Retry-After`` too large
or not a number, a 2xx without a message SID, a fetch answered with
something other than a message, Twilio's text that PostgreSQL cannot store,
and a SID that is not safe in a path."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import pytest
import trio

from tests.sms.twilio_double import ACCOUNT_SID, AUTH_TOKEN, TwilioDouble, started
from tidings.providers.sms import MAX_RETRY_AFTER, OutgoingSms
from tidings.providers.twilio import UNREADABLE, TwilioSms, TwilioUnavailable

NUMBER = "+14155550123"
DATE = "Tue, 24 Nov 2026 06:00:00 GMT"


@pytest.fixture
async def double(nursery: trio.Nursery) -> TwilioDouble:
    return await started(nursery)


@pytest.fixture
async def twilio(double: TwilioDouble) -> AsyncIterator[TwilioSms]:
    async with httpx.AsyncClient(auth=(ACCOUNT_SID, AUTH_TOKEN)) as client:
        yield TwilioSms(client, double.base, ACCOUNT_SID)


def outgoing(to: str = NUMBER) -> OutgoingSms:
    return OutgoingSms(uuid.uuid4(), uuid.uuid4(), to, "Acme", "hi")


def throttled(**headers: str) -> tuple[int, bytes, dict[str, str]]:
    body = json.dumps({"code": 20429, "message": "Too Many Requests", "status": 429})
    return 429, body.encode(), {"Content-Type": "application/json", **headers}


@pytest.mark.parametrize(("headers", "after"), [
    ({"Retry-After": "3600"}, timedelta(hours=1)),
    ({"Retry-After": "999999999999"}, MAX_RETRY_AFTER),
    ({"Retry-After": "9" * 5000}, MAX_RETRY_AFTER),  # int() refuses over 4300 digits
    ({"Retry-After": "86401"}, MAX_RETRY_AFTER),
    # Digits to str.isdigit, not to int(), nor to HTTP: not a Retry-After.
    ({"Retry-After": "²"}, None),
    ({"Retry-After": "٣"}, None),
    ({"Retry-After": "-5"}, None),
    ({"Retry-After": "Tue, 24 Nov 2026 06:00:30 GMT", "Date": DATE}, timedelta(seconds=30)),
    # A date without a zone is UTC, compared with a zoned one.
    ({"Retry-After": "Tue, 24 Nov 2026 06:00:30 -0000", "Date": DATE}, timedelta(seconds=30)),
    ({"Retry-After": "Tue, 24 Nov 2026 05:00:00 GMT", "Date": DATE}, timedelta(0)),
    ({"Retry-After": "Fri, 31 Dec 9999 23:59:59 GMT", "Date": DATE}, MAX_RETRY_AFTER),
    # Without the answer's Date, counted from now.
    ({"Retry-After": "Fri, 31 Dec 9999 23:59:59 GMT"}, MAX_RETRY_AFTER),
    ({"Retry-After": "Fri, 31 Dec 9999 23:59:59 GMT", "Date": "garbage"}, MAX_RETRY_AFTER),
    ({"Retry-After": "Mon, 31 Feb 2026 00:00:00 GMT"}, None),
])
async def test_retry_after_is_read_as_ascii_seconds_or_a_date_and_capped(
    double: TwilioDouble, twilio: TwilioSms, headers: dict[str, str], after: timedelta | None
) -> None:
    double.answers[NUMBER] = throttled(**headers)
    result = await twilio.send(outgoing())
    assert result.retry is not None and result.provider_message_id is None
    assert (result.retry.code, result.retry.message) == ("20429", "Too Many Requests")
    assert result.retry.after == after


@pytest.mark.parametrize("body", [
    b"{not json", b"[1]", b'{"status": "queued"}', b'{"sid": ""}', b'{"sid": 17}',
    b'{"sid": "SM\\u0000"}', b'{"sid": "SM 1"}',
])
async def test_a_2xx_without_a_readable_sid_is_unknown_not_a_refusal(
    double: TwilioDouble, twilio: TwilioSms, body: bytes
) -> None:
    double.answers[NUMBER] = (201, body, {"Content-Type": "application/json"})
    result = await twilio.send(outgoing())
    assert result.retry is None and result.provider_message_id is None
    (update,) = result.updates
    assert (update.status, update.code) == ("unknown", UNREADABLE)
    assert update.message is not None and "could not be read" in update.message
    assert len(double.sends) == 1


async def test_twilios_text_is_made_storable(double: TwilioDouble, twilio: TwilioSms) -> None:
    """NUL and lone surrogates, which PostgreSQL's text and UTF-8 refuse."""
    body = b'{"code": "2\\u00001", "message": "bad\\u0000number \\ud800", "status": 400}'
    double.answers[NUMBER] = (400, body, {"Content-Type": "application/json"})
    (update,) = (await twilio.send(outgoing())).updates
    assert (update.status, update.code, update.message) == (
        "rejected", "2\ufffd1", "bad\ufffdnumber \ufffd"
    )


@pytest.mark.parametrize("body", [b"<html>oops", b"[1]", b'{"sid": "SM1"}', b'{"status": 3}'])
async def test_a_fetch_answered_with_no_message_is_no_answer(
    double: TwilioDouble, twilio: TwilioSms, body: bytes
) -> None:
    double.fetch_answers["SM1"] = (200, body, {"Content-Type": "application/json"})
    with pytest.raises(TwilioUnavailable, match="could not be read"):
        await twilio.fetch("SM1")


async def test_a_sid_is_one_path_segment(double: TwilioDouble, twilio: TwilioSms) -> None:
    sid = "SM/../x?y#z%41"
    double.messages[sid] = {"sid": sid, "status": "delivered"}
    update = await twilio.fetch(sid)
    assert update is not None and update.status == "delivered"
    assert double.receiver is not None
    assert double.receiver.requests[-1].path == (
        f"/2010-04-01/Accounts/{ACCOUNT_SID}/Messages/SM%2F..%2Fx%3Fy%23z%2541.json"
    )


async def test_a_review_answered_with_no_list_leaves_the_sender_id_pending(
    double: TwilioDouble, twilio: TwilioSms
) -> None:
    assert await twilio.review_sender_id("+14155550100", "long_code") == "rejected"
    for body in (b"<html>oops", b"[1]", b'{"incoming_phone_numbers": "yes", "short_codes": 1}'):
        double.numbers_answer = (200, body, {"Content-Type": "application/json"})
        assert await twilio.review_sender_id("+14155550100", "long_code") == "pending"
        assert await twilio.review_sender_id("55555", "short_code") == "pending"
