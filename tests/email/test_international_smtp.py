"""Internationalised addresses through the SMTP provider to a real SMTP
server on loopback, over HTTP: IDN domains go out in their xn-- form in the
envelope and the headers alike (IDNA 2008), and an address outside ASCII
before the @ that still reaches the client (a contact's, in a broadcast) is
sent with SMTPUTF8 when the server offers it and fails with a clear reason,
at once and without a traceback, when it does not."""

from __future__ import annotations

import email
import email.policy
from collections.abc import Iterator
from typing import Any

import dkim
import httpx
import pytest
import trio

from tests.email.conftest import smtp_config
from tests.email.helpers import events, ok, send
from tests.email.smtp_sink import Sink, running_sink
from tidings.config import Config
from tidings.email.bounce_addresses import parse_bounce_address


class OptionsSink(Sink):
    """Also records the parameters of each MAIL FROM."""

    def __init__(self) -> None:
        super().__init__()
        self.mail_options: list[list[str]] = []

    async def handle_MAIL(
        self, server: Any, session: Any, envelope: Any, address: str, options: list[str]
    ) -> str:
        self.mail_options.append(list(options))
        return await super().handle_MAIL(server, session, envelope, address, options)


@pytest.fixture
def sink() -> OptionsSink:
    return OptionsSink()


@pytest.fixture
def sink_options() -> dict[str, Any]:
    """Options of the aiosmtpd server: without SMTPUTF8 unless a test asks
    (aiosmtpd's Controller offers it by default)."""
    return {"enable_SMTPUTF8": False}


@pytest.fixture
def port(sink: Sink, sink_options: dict[str, Any]) -> Iterator[int]:
    with running_sink(sink, **sink_options) as port:
        yield port


@pytest.fixture
def config(database_url: str, port: int) -> Config:
    return smtp_config(database_url, port)


@pytest.fixture
def client(client: httpx.AsyncClient, acme_domain: str, bucher_domain: str) -> httpx.AsyncClient:
    return client


async def settled(client: httpx.AsyncClient, email_id: str, status: str) -> list[dict[str, Any]]:
    with trio.fail_after(10):
        while ok(await client.get(f"/emails/{email_id}"))["status"] != status:
            await trio.sleep(0.05)
    return list(reversed(await events(client, email_id)))


def verifies(client_records: list[dict[str, Any]], data: bytes) -> bool:
    record = next(r for r in client_records if r["purpose"] == "dkim")

    def lookup(name: bytes, timeout: int = 5) -> bytes:
        assert name.decode().rstrip(".") == record["name"]
        return str(record["value"]).encode()

    return bool(dkim.verify(data, dnsfunc=lookup))


async def test_idn_display_names_go_out_in_their_ascii_form(
    client: httpx.AsyncClient, sink: OptionsSink
) -> None:
    email_id = await send(
        client, **{"from": "News <news@BÜCHER.example>"}, to="Ann <ann@bücher.com>",
        cc=["Cy <cy@xn--bcher-kva.com>"], bcc="Di <di@bücher.com>",
        reply_to="Help <help@bücher.example>", subject="Grüße",
    )
    found = await settled(client, email_id, "sent")
    assert sorted(e["recipient"] for e in found if e["type"] == "sent") == [
        "ann@bücher.com", "cy@bücher.com", "di@bücher.com",
    ]
    # One transaction per recipient, each from its bounce address on the
    # return-path host in its ASCII form.
    assert [m.recipients for m in sink.messages] == [
        ["ann@xn--bcher-kva.com"], ["cy@xn--bcher-kva.com"], ["di@xn--bcher-kva.com"],
    ]
    for m in sink.messages:
        assert m.mail_from.endswith("@bounces.xn--bcher-kva.example")
        back = parse_bounce_address(m.mail_from)
        assert back is not None and str(back.email_id) == email_id
    assert len({m.data for m in sink.messages}) == 1
    received = sink.messages[0]
    assert sink.mail_options == [[]] * 3 and received.data.isascii()
    message = email.message_from_bytes(received.data, policy=email.policy.default)
    assert message["From"] == "News <news@xn--bcher-kva.example>"
    assert message["To"] == "Ann <ann@xn--bcher-kva.com>"
    assert message["Cc"] == "Cy <cy@xn--bcher-kva.com>" and message["Bcc"] is None
    assert message["Reply-To"] == "Help <help@xn--bcher-kva.example>"
    assert message["Subject"] == "Grüße"
    domain = next(d for d in ok(await client.get("/domains"))["data"]
                  if d["name"] == "xn--bcher-kva.example")
    assert verifies(domain["records"], received.data)


async def test_the_envelope_and_the_headers_spell_a_domain_alike(
    client: httpx.AsyncClient, sink: OptionsSink
) -> None:
    # IDNA 2008 keeps ß (IDNA 2003, Python's "idna" codec, made it "ss":
    # another domain than the one the To header names).
    email_id = await send(client, to="Ada <ada@straße.de>")
    await settled(client, email_id, "sent")
    [received] = sink.messages
    assert received.recipients == ["ada@xn--strae-oqa.de"]
    message = email.message_from_bytes(received.data, policy=email.policy.default)
    assert message["To"] == "Ada <ada@xn--strae-oqa.de>"


async def broadcast_to(client: httpx.AsyncClient, address: str) -> str:
    """A broadcast from ``Shop <shop@bücher.example>`` to one contact,
    ``address``, sent; the id of its email once it exists."""
    segment = ok(await client.post("/segments", json={"name": "everyone"}), 201)
    contact = ok(await client.post("/contacts", json={"email": address}), 201)
    ok(await client.post(f"/contacts/{contact['id']}/segments/{segment['id']}"))
    broadcast = ok(await client.post("/broadcasts", json={
        "name": "News", "segment_id": segment["id"], "from_email": "shop@bücher.example",
        "from_name": "Shop", "subject": "Hello",
        "html": '<p>Hi</p><a href="{{{unsubscribe_url}}}">unsubscribe</a>',
    }), 201)
    ok(await client.post(f"/broadcasts/{broadcast['id']}/send"))
    with trio.fail_after(20):
        while not (found := ok(await client.get("/emails"))["data"]):
            await trio.sleep(0.05)
    [made] = found
    assert made["from"] == "Shop <shop@bücher.example>"
    email_id: str = made["id"]
    return email_id


async def test_an_address_outside_ascii_fails_clearly_without_smtputf8(
    client: httpx.AsyncClient, sink: OptionsSink
) -> None:
    email_id = await broadcast_to(client, "josé@dest.com")
    found = await settled(client, email_id, "failed")
    # Failed at the first try (no retry), with the reason, not an exception's name.
    assert [(e["type"], e["recipient"], e["code"]) for e in found] == [
        ("queued", "josé@dest.com", None), ("failed", "josé@dest.com", "553"),
    ]
    reason = found[-1]["message"]
    assert reason.startswith("5.6.7 ") and "SMTPUTF8" in reason and "josé@dest.com" in reason
    assert "Error" not in reason
    assert sink.messages == [] and sink.mail_options == []


@pytest.mark.parametrize("sink_options", [{"enable_SMTPUTF8": True}])
async def test_an_address_outside_ascii_is_sent_with_smtputf8_when_offered(
    client: httpx.AsyncClient, sink: OptionsSink
) -> None:
    email_id = await broadcast_to(client, "josé@bücher.com")
    found = await settled(client, email_id, "sent")
    assert [(e["type"], e["code"]) for e in found] == [("queued", None), ("sent", "250")]
    [received] = sink.messages
    assert sink.mail_options == [["BODY=8BITMIME", "SMTPUTF8"]]
    assert received.recipients == ["josé@xn--bcher-kva.com"]
    message = email.message_from_bytes(received.data, policy=email.policy.SMTPUTF8)
    assert message["To"] == "josé@xn--bcher-kva.com"
    assert message["From"] == "Shop <shop@xn--bcher-kva.example>"
    domain = next(d for d in ok(await client.get("/domains"))["data"]
                  if d["name"] == "xn--bcher-kva.example")
    assert verifies(domain["records"], received.data)
