"""A message is sent at most once by a provider that texts people: a send
whose answer is lost (too slow, or the process stopped mid-send) makes the
message ``unknown``, never a second send."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import httpx
import pytest
import trio

from tests.sms.helpers import ok, send, settled
from tests.sms.twilio_double import ACCOUNT_SID, AUTH_TOKEN, TwilioDouble, started, twilio_config
from tests.webhooks.receiver import HangUp
from tidings.config import Config
from tidings.providers.sms import AnswerLost, OutgoingSms
from tidings.providers.twilio import TwilioSms, signature
from tidings.service import Service

PUBLIC = "https://tidings.example"
STATUS = "/providers/twilio/status"
SENDER = "+14155550100"
LEASE = 2.0  # a send is given up after half of it


@pytest.fixture
async def double(nursery: trio.Nursery) -> TwilioDouble:
    return await started(nursery, owned_numbers={SENDER})


@pytest.fixture
def config(database_url: str, double: TwilioDouble) -> Config:
    return twilio_config(database_url, double, PUBLIC, sms_lease_seconds=LEASE)


@pytest.fixture
async def client(client: httpx.AsyncClient) -> httpx.AsyncClient:
    ok(await client.post("/sender-ids", json={"value": SENDER, "type": "long_code"}), 201)
    return client


async def begun(service: Service, sms_id: str) -> datetime | None:
    async with service.db.acquire() as conn:
        found: datetime | None = await conn.fetchval(
            "SELECT send_begun_at FROM sms_messages WHERE id = $1", UUID(sms_id))
    return found


async def test_a_send_answered_and_recorded_leaves_no_mark(
    client: httpx.AsyncClient, double: TwilioDouble, service: Service
) -> None:
    sms = await settled(client, (await send(client, **{"from": SENDER}))["id"], "submitted")
    assert len(double.sends) == 1 and await begun(service, sms["id"]) is None


async def test_an_answer_slower_than_half_the_lease_is_unknown_and_not_sent_again(
    client: httpx.AsyncClient, http: httpx.AsyncClient, double: TwilioDouble
) -> None:
    async def slow(_sid: str) -> None:
        await trio.sleep(LEASE * 1.5)  # past the lease: another claim could come

    double.before_created = slow
    sms = await send(client, **{"from": SENDER})
    lost = await settled(client, sms["id"], "unknown")
    assert lost["failure"]["code"] == "answer_lost"
    assert "within 1 s" in lost["failure"]["message"]
    await trio.sleep(LEASE * 2)  # the lease is long gone: nothing takes it up again
    assert len(double.sends) == 1
    assert ok(await client.get(f"/sms/{sms['id']}"))["last_event"] == "unknown"

    # Twilio took it: its callbacks name the message in their signed URL, so
    # they find it without the SID the lost answer carried.
    [(_at, form)] = double.sends
    [sid] = double.messages
    callback = form["StatusCallback"]
    assert callback == f"{PUBLIC}{STATUS}?sms={sms['id']}"
    for status in ("sent", "delivered"):
        params = {"MessageSid": sid, "MessageStatus": status}
        answer = await http.post(callback.removeprefix(PUBLIC), data=params, headers={
            "X-Twilio-Signature": signature(AUTH_TOKEN, callback, params.items())})
        assert answer.status_code == 200, answer.text
    found = ok(await client.get(f"/sms/{sms['id']}"))
    assert (found["last_event"], found["message_id"]) == ("delivered", sid)


async def test_a_connection_lost_after_the_request_is_unknown_and_not_sent_again(
    client: httpx.AsyncClient, double: TwilioDouble
) -> None:
    """Twilio read the request and took the message, then the connection
    went with no answer: it is no refusal to send again (it would text the
    person twice), but a lost answer."""
    async def hang_up(_sid: str) -> None:
        raise HangUp

    double.before_created = hang_up
    sms = await send(client, **{"from": SENDER})
    lost = await settled(client, sms["id"], "unknown")
    assert lost["failure"]["code"] == "answer_lost"
    assert "RemoteProtocolError" in lost["failure"]["message"]
    await trio.sleep(LEASE * 2)  # past the lease and the first retry's time
    assert len(double.sends) == 1


async def test_a_send_that_could_not_reach_twilio_is_retried_one_that_reached_it_is_lost(
    double: TwilioDouble,
) -> None:
    """Refused at connect, the request never left: a retry cannot text the
    person twice. Read by Twilio and unanswered, it may have been taken."""
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    refusing = listener.getsockname()[1]
    listener.close()  # nothing listens there: the connection is refused
    outgoing = OutgoingSms(message_id=uuid4(), team_id=uuid4(), to="+14155550123",
                           sender=SENDER, body="hi", status_callback=None)
    async with httpx.AsyncClient(auth=(ACCOUNT_SID, AUTH_TOKEN)) as http:
        refused = await TwilioSms(http, f"http://127.0.0.1:{refusing}", ACCOUNT_SID).send(outgoing)
        assert refused.retry is not None and refused.provider_message_id is None
        assert double.sends == []

        async def hang_up(_sid: str) -> None:
            raise HangUp

        double.before_created = hang_up
        with pytest.raises(AnswerLost, match="RemoteProtocolError"):
            await TwilioSms(http, double.base, ACCOUNT_SID).send(outgoing)
        assert len(double.sends) == 1


async def test_a_send_begun_by_a_process_that_stopped_is_not_made_again(
    client: httpx.AsyncClient, double: TwilioDouble, service: Service
) -> None:
    """What a process killed mid-send leaves: the message leased to it, its
    send marked begun, no answer recorded. Once the lease has run out, the
    message is taken up and found begun."""
    at = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    sms = await send(client, **{"from": SENDER, "scheduled_at": at})
    async with service.db.acquire() as conn:
        await conn.execute(
            "UPDATE sms_messages SET scheduled_at = now(), next_attempt_at = now(), "
            "send_begun_at = now(), lease_owner = $2, leased_until = now() - interval '1 s' "
            "WHERE id = $1", UUID(sms["id"]), uuid4())
    lost = await settled(client, sms["id"], "unknown")
    assert lost["failure"]["code"] == "answer_lost" and "stopped" in lost["failure"]["message"]
    assert double.sends == []
