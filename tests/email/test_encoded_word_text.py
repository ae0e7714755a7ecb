"""Text that looks like an RFC 2047 encoded word (``=?utf-8?b?...?=``) in a
display name, a subject or a header's value: accepted, stored and shown as
given, and written so that a mail client (here the standard library's parser
with its default policy, which decodes encoded words) reads the same text."""

from __future__ import annotations

import email
import email.policy
from email.message import EmailMessage
from typing import Any

import httpx
import pytest
import trio

from tests.email.conftest import smtp_config
from tests.email.helpers import ok, send
from tests.email.smtp_sink import Sink
from tidings.config import Config

# (as given in the request, as the API shows it, the display name a client reads)
NAMES = [
    ('"=?utf-8?q?hi?=" <q3@dest.example>', "=?utf-8?q?hi?= <q3@dest.example>",
     "=?utf-8?q?hi?="),
    ('"Win =?utf-8?b?QWRtaW4=?= now" <q5@dest.example>',
     "Win =?utf-8?b?QWRtaW4=?= now <q5@dest.example>", "Win =?utf-8?b?QWRtaW4=?= now"),
    ("=?utf-8?b?QWRtaW4=?= <j@dest.example>", "=?utf-8?b?QWRtaW4=?= <j@dest.example>",
     "=?utf-8?b?QWRtaW4=?="),
    ('"=?utf-8?q?x=0D=0AEvil:_1?=" <e@dest.example>',
     '"=?utf-8?q?x=0D=0AEvil:_1?=" <e@dest.example>', "=?utf-8?q?x=0D=0AEvil:_1?="),
]
TRICKY = "=?utf-8?q?x=0D=0AEvil:_1?="


@pytest.fixture
def config(database_url: str, port: int) -> Config:
    return smtp_config(database_url, port)


@pytest.fixture
def client(client: httpx.AsyncClient, acme_domain: str) -> httpx.AsyncClient:
    return client


async def received(client: httpx.AsyncClient, sink: Sink, email_id: str) -> EmailMessage:
    """The message of ``email_id`` as the sink received it, parsed."""
    with trio.fail_after(10):
        while ok(await client.get(f"/emails/{email_id}"))["status"] != "sent":
            await trio.sleep(0.05)
    for message in sink.messages:
        parsed = email.message_from_bytes(message.data, policy=email.policy.default)
        if parsed["Message-ID"] == f"<{email_id}@acme.example>":
            assert isinstance(parsed, EmailMessage)
            return parsed
    raise AssertionError(f"no message for {email_id}")


async def test_display_names_with_encoded_word_text_are_kept_as_given(
    client: httpx.AsyncClient, sink: Sink
) -> None:
    email_id = await send(
        client, to=[given for given, _, _ in NAMES],
        **{"from": "=?utf-8?b?QWRtaW4=?= <hi@acme.example>"},
    )
    email_data = ok(await client.get(f"/emails/{email_id}"))
    assert email_data["to"] == [shown for _, shown, _ in NAMES]
    assert email_data["from"] == "=?utf-8?b?QWRtaW4=?= <hi@acme.example>"
    message = await received(client, sink, email_id)
    to: Any = message["To"]
    assert [(a.display_name, a.addr_spec) for a in to.addresses] == [
        (name, shown.rsplit("<", 1)[1].rstrip(">")) for _, shown, name in NAMES
    ]
    sender: Any = message["From"]
    assert [a.display_name for a in sender.addresses] == ["=?utf-8?b?QWRtaW4=?="]
    # What the API shows is accepted again and is the same mailbox.
    again = await send(client, to=email_data["to"], **{"from": email_data["from"]})
    shown_again = ok(await client.get(f"/emails/{again}"))
    assert (shown_again["to"], shown_again["from"]) == (email_data["to"], email_data["from"])


async def test_subject_and_header_values_with_encoded_word_text_read_as_given(
    client: httpx.AsyncClient, sink: Sink
) -> None:
    headers = {"X-Note": f"see {TRICKY} here", "X-Plain": "=?"}
    email_id = await send(client, subject=f"Hi {TRICKY}", headers=headers)
    message = await received(client, sink, email_id)
    assert message["Subject"] == f"Hi {TRICKY}"
    assert ok(await client.get(f"/emails/{email_id}"))["subject"] == f"Hi {TRICKY}"
    assert {name: message[name] for name in headers} == headers
    assert "Evil" not in message


async def test_a_template_variable_with_encoded_word_text(
    client: httpx.AsyncClient, sink: Sink
) -> None:
    created = ok(await client.post("/templates", json={
        "name": "Note", "alias": "note", "subject": "Re: {{{topic}}}", "html": "<p>x</p>",
        "variables": [{"key": "topic", "type": "string"}],
    }), 201)
    ok(await client.post(f"/templates/{created['id']}/publish"))
    email_id = await send(client, subject=None, html=None,
                          template={"alias": "note", "variables": {"topic": TRICKY}})
    message = await received(client, sink, email_id)
    assert message["Subject"] == f"Re: {TRICKY}" == ok(
        await client.get(f"/emails/{email_id}"))["subject"]
    assert "Evil" not in message
