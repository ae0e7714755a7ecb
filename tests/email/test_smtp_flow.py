"""Emails through the SMTP provider to a real SMTP server on loopback: the
send worker's DKIM-signed message as dkimpy verifies it, a bounce at RCPT,
and a deferral retried until its last try fails."""

from __future__ import annotations

import email
import email.policy
from typing import Any

import dkim
import httpx
import pytest
import trio

from tests.email.conftest import smtp_config
from tests.email.helpers import events, ok, send
from tests.email.smtp_sink import Sink
from tidings.config import Config
from tidings.email.bounce_addresses import parse_bounce_address
from tidings.service import Service


@pytest.fixture
def config(database_url: str, port: int) -> Config:
    return smtp_config(database_url, port)


@pytest.fixture
def client(client: httpx.AsyncClient, acme_domain: str) -> httpx.AsyncClient:
    return client


async def types_when(
    client: httpx.AsyncClient, email_id: str, status: str, within: float = 10
) -> list[dict[str, Any]]:
    with trio.fail_after(within):
        while ok(await client.get(f"/emails/{email_id}"))["status"] != status:
            await trio.sleep(0.05)
    return list(reversed(await events(client, email_id)))


async def test_the_message_arrives_dkim_signed(client: httpx.AsyncClient, sink: Sink) -> None:
    email_id = await send(client, to="Ada <ada@example.com>", subject="Receipt",
                          html="<p>Thanks</p>", headers={"X-Order": "7"})
    found = await types_when(client, email_id, "sent")
    assert [(e["type"], e["provider"], e["code"]) for e in found] == [
        ("queued", "smtp", None), ("sent", "smtp", "250"),
    ]
    [received] = sink.messages
    assert received.recipients == ["ada@example.com"]
    back = parse_bounce_address(received.mail_from)
    assert back is not None and (str(back.email_id), back.domain) == (email_id, "acme.example")
    message = email.message_from_bytes(received.data, policy=email.policy.default)
    assert message["Message-ID"] == f"<{email_id}@acme.example>"
    assert message["Subject"] == "Receipt" and message["X-Order"] == "7"

    [domain] = ok(await client.get("/domains"))["data"]
    record = next(r for r in domain["records"] if r["purpose"] == "dkim")

    def lookup(name: bytes, timeout: int = 5) -> bytes:
        assert name.decode().rstrip(".") == record["name"]
        return str(record["value"]).encode()

    assert dkim.verify(received.data, dnsfunc=lookup)


async def test_each_recipient_gets_its_own_transaction_and_bounce_address(
    client: httpx.AsyncClient, sink: Sink, service: Service
) -> None:
    """An email to two: two transactions, each from a bounce address that
    names the email and vouches for its own recipient only, with the same
    DKIM-signed message."""
    email_id = await send(client, to=["ada@example.com", "bo@example.com"], subject="Receipt")
    await types_when(client, email_id, "sent")
    assert sorted(m.recipients for m in sink.messages) == [
        ["ada@example.com"], ["bo@example.com"]
    ]
    key = await service.emails.bounce_key()
    returns = {m.recipients[0]: m.mail_from for m in sink.messages}
    assert len(set(returns.values())) == 2
    for recipient, mail_from in returns.items():
        assert mail_from.endswith("@bounces.acme.example")
        back = parse_bounce_address(mail_from)
        assert back is not None and str(back.email_id) == email_id
        other = "bo@example.com" if recipient == "ada@example.com" else "ada@example.com"
        assert key.vouches(back, back.email_id, recipient)
        assert not key.vouches(back, back.email_id, other)
    assert len({m.data for m in sink.messages}) == 1
    assert len({m.session for m in sink.messages}) == 1
    [domain] = ok(await client.get("/domains"))["data"]
    record = next(r for r in domain["records"] if r["purpose"] == "dkim")

    def lookup(name: bytes, timeout: int = 5) -> bytes:
        assert name.decode().rstrip(".") == record["name"]
        return str(record["value"]).encode()

    assert all(dkim.verify(m.data, dnsfunc=lookup) for m in sink.messages)


async def test_a_refusal_at_rcpt_is_a_bounce_and_suppresses(
    client: httpx.AsyncClient, sink: Sink
) -> None:
    sink.rcpt_replies["gone@example.com"] = "550 5.1.1 no such user"
    email_id = await send(client, to=["gone@example.com", "ada@example.com"])
    found = await types_when(client, email_id, "sent")
    assert sorted((e["type"], e["recipient"]) for e in found[1:]) == [
        ("bounced", "gone@example.com"), ("sent", "ada@example.com"),
    ]
    bounced = next(e for e in found if e["type"] == "bounced")
    assert bounced["code"] == "550" and "no such user" in bounced["message"]
    # The webhook event carries the provider's status too.
    [hook] = ok(await client.get("/events", params={"type": "message.bounced"}))["data"]
    assert (hook["data"]["code"], hook["data"]["message"]) == ("550", bounced["message"])
    [suppression] = ok(await client.get("/suppressions"))["data"]
    assert (suppression["address"], suppression["reason"]) == ("gone@example.com", "bounce")
    assert [m.recipients for m in sink.messages] == [["ada@example.com"]]


async def test_a_deferral_is_retried_and_fails_after_the_last_try(
    client: httpx.AsyncClient, sink: Sink
) -> None:
    sink.rcpt_replies["busy@example.com"] = "451 4.3.0 try later"
    email_id = await send(client, to="busy@example.com")
    found = await types_when(client, email_id, "failed")
    tries = [(e["type"], e["code"]) for e in found]
    # Each try put off is reported as it happens; the last one fails.
    assert tries[0] == ("queued", None) and tries[-1] == ("failed", "451")
    assert tries[1:-1] and set(tries[1:-1]) == {("delivery_delayed", "451")}
    [hook] = ok(await client.get("/events", params={"type": "message.failed"}))["data"]
    assert hook["data"]["code"] == "451" and "try later" in hook["data"]["message"]
    delayed = ok(await client.get("/events", params={"type": "message.delivery_delayed"}))
    assert len(delayed["data"]) == len(tries) - 2
    assert {(h["channel"], h["data"]["code"]) for h in delayed["data"]} == {
        ("email", "451")}
    assert sink.messages == []


class OnceBusy(Sink):
    """Answers 451 to each address in ``busy`` once, then takes it."""

    def __init__(self, *busy: str) -> None:
        super().__init__()
        self.busy = set(busy)

    async def handle_RCPT(
        self, server: Any, session: Any, envelope: Any, address: str, options: list[str]
    ) -> str:
        if address in self.busy:
            self.busy.discard(address)
            return "451 4.3.0 try later"
        return await super().handle_RCPT(server, session, envelope, address, options)


@pytest.mark.parametrize("sink", [OnceBusy("busy@example.com")])
async def test_a_deferred_recipient_is_sent_at_the_retry(
    client: httpx.AsyncClient, sink: Sink
) -> None:
    email_id = await send(client, to=["ada@example.com", "busy@example.com"])
    with trio.fail_after(10):
        while len(sink.messages) < 2:
            await trio.sleep(0.05)
    assert [m.recipients for m in sink.messages] == [["ada@example.com"], ["busy@example.com"]]
    # The second "sent" is recorded after the sink has the message: wait for it.
    with trio.fail_after(10):
        while len(found := list(reversed(await events(client, email_id)))) < 4:
            await trio.sleep(0.05)
    assert [(e["type"], e["recipient"]) for e in found] == [
        ("queued", "ada@example.com, busy@example.com"),
        ("sent", "ada@example.com"),
        ("delivery_delayed", "busy@example.com"),
        ("sent", "busy@example.com"),
    ]
    assert ok(await client.get(f"/emails/{email_id}"))["status"] == "sent"
