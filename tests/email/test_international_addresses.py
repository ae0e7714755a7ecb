"""Internationalised addresses at acceptance and in the list filter, over HTTP:
a display name with an IDN domain is accepted and shown (never a 500), a
local part outside ASCII is refused with 400 naming the field (Tidings
sends without SMTPUTF8), and ``GET /emails?to=`` finds an email in either
spelling of its domain."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import httpx
import pytest

from tests.conftest import Credential, assert_error
from tests.email.helpers import SENDER, ok, send
from tidings.addresses import Mailbox
from tidings.service import Service
from tidings.storage import templates as template_store
from tidings.storage.templates import VersionContent


@pytest.fixture
def client(client: httpx.AsyncClient, acme_domain: str, bucher_domain: str) -> httpx.AsyncClient:
    """Team acme's client; acme.example and bücher.example are its verified domains."""
    return client


def body(**fields: Any) -> dict[str, Any]:
    return {"from": SENDER, "to": "ada@example.com", "subject": "s", "text": "t", **fields}


async def test_a_display_name_with_an_idn_domain_is_accepted_and_shown(
    client: httpx.AsyncClient,
) -> None:
    email_id = await send(
        client,
        **{"from": "News <news@BÜCHER.example>"},
        to=["Ann <ann@bücher.com>", "Bo <bo@xn--bcher-kva.com>"],
        cc="Cy <cy@bücher.com>", bcc=["Di <di@bücher.com>"],
        reply_to='"Help, Desk" <help@bücher.example>',
    )
    email = ok(await client.get(f"/emails/{email_id}"))
    # The address as normalised (the domain in its Unicode form), the name as given.
    assert email["from"] == "News <news@bücher.example>"
    assert email["to"] == ["Ann <ann@bücher.com>", "Bo <bo@bücher.com>"]
    assert email["cc"] == ["Cy <cy@bücher.com>"]
    assert email["bcc"] == ["Di <di@bücher.com>"]
    assert email["reply_to"] == ['"Help, Desk" <help@bücher.example>']
    # A name outside ASCII is shown as given too, not RFC 2047-encoded.
    sender, recipient = "Zoë Café <hi@acme.example>", "Ünïcode <u@bücher.com>"
    named = await send(client, **{"from": sender}, to=recipient)
    email = ok(await client.get(f"/emails/{named}"))
    assert (email["from"], email["to"]) == (sender, [recipient])
    # The broadcasts' sender is shown the same way.
    assert Mailbox("Shop", "shop@bücher.example").formatted == "Shop <shop@bücher.example>"


async def test_a_batch_item_with_an_idn_display_name_is_accepted(
    client: httpx.AsyncClient,
) -> None:
    items = [body(), body(to="Ann <ann@bücher.com>", cc=["Cy <cy@bücher.com>"])]
    data = ok(await client.post("/emails/batch", json=items), 202)
    second = ok(await client.get(f"/emails/{data['data'][1]['id']}"))
    assert (second["to"], second["cc"]) == (["Ann <ann@bücher.com>"], ["Cy <cy@bücher.com>"])


async def test_a_template_sender_with_an_idn_domain_is_used(client: httpx.AsyncClient) -> None:
    template = ok(await client.post("/templates", json={
        "name": "Shop", "alias": "shop", "from": "Shop <shop@bücher.example>",
        "subject": "Hi", "html": "<p>Hi</p>",
    }), 201)
    ok(await client.post(f"/templates/{template['id']}/publish"))
    sent = ok(await client.post("/emails", json={
        "to": "Ann <ann@bücher.com>", "template": {"alias": "shop"},
    }), 202)
    email = ok(await client.get(f"/emails/{sent['id']}"))
    assert email["from"] == "Shop <shop@bücher.example>"


REFUSED: list[tuple[dict[str, Any], str]] = [
    (body(to="josé@dest.com"), "to"),
    (body(to=["ada@example.com", "ünïcode@dest.com"]), "to.1"),
    (body(to="José <josé@bücher.com>"), "to"),
    (body(cc="josé@dest.com"), "cc"),
    (body(bcc=["ünïcode@dest.com"]), "bcc"),
    (body(reply_to="rü@dest.com"), "reply_to"),
    (body(**{"from": "adä@example.com"}), "from"),
    (body(**{"from": "Ada <adä@acme.example>"}), "from"),
]


async def test_a_local_part_outside_ascii_is_refused_naming_the_field(
    client: httpx.AsyncClient,
) -> None:
    for refused, field in REFUSED:
        message = assert_error(await client.post("/emails", json=refused), 400, "BAD_REQUEST")
        assert message.startswith(f"{field}: "), (refused, message)
        assert "SMTPUTF8" in message and "outside ASCII" in message, message
    batch = [body(), body(cc=["ok@example.com", "josé@dest.com"])]
    message = assert_error(await client.post("/emails/batch", json=batch), 400, "BAD_REQUEST")
    assert message.startswith("1.cc.1: ") and "SMTPUTF8" in message
    assert ok(await client.get("/emails"))["data"] == []


async def test_a_template_sender_outside_ascii_is_refused(client: httpx.AsyncClient) -> None:
    for field, value in (("from", "Shop <shöp@acme.example>"), ("reply_to", "rü@acme.example")):
        made = await client.post("/templates", json={
            "name": "Shop", "subject": "Hi", "html": "<p>Hi</p>", field: value,
        })
        message = assert_error(made, 400, "BAD_REQUEST")
        assert field in message and "SMTPUTF8" in message, message


async def test_a_stored_template_sender_outside_ascii_is_422(
    client: httpx.AsyncClient, service: Service, acme: Credential
) -> None:
    """A version stored before the rule: the body is fine, the template cannot be used."""
    for alias, content, field in (
        ("old-reply", {"reply_to_email": "rü@acme.example"}, "template.reply_to"),
        ("old-from", {"from_email": "shöp@acme.example"}, "template.from"),
    ):
        version = VersionContent(
            subject="Hi", html="<p>Hi</p>", text=None, from_email="shop@acme.example",
            from_name="Shop", reply_to_email="help@acme.example", variables=(),
        )
        async with service.db.acquire() as conn:
            template_id = await template_store.create_template(
                conn, acme.team_id, "Old", alias, None, replace(version, **content)
            )
        ok(await client.post(f"/templates/{template_id}/publish"))
        refused = await client.post("/emails", json={"to": "a@example.com",
                                                     "template": {"alias": alias}})
        message = assert_error(refused, 422, "UNPROCESSABLE_ENTITY")
        assert message.startswith(f"{field}: ") and "SMTPUTF8" in message, message
        # Given in the body, the address wins over the version's: accepted.
        ok(await client.post("/emails", json={
            "from": SENDER, "reply_to": "help@acme.example", "to": "a@example.com",
            "template": {"alias": alias},
        }), 202)


async def test_the_to_filter_finds_every_spelling_of_an_idn_domain(
    client: httpx.AsyncClient,
) -> None:
    a_label = await send(client, to="user@xn--bcher-kva.com")
    u_label = await send(client, to="Ann <Ann@Bücher.com>")
    await send(client, to="user@example.com")
    for spelling in ("user@xn--bcher-kva.com", "USER@XN--BCHER-KVA.COM", "user@bücher.com",
                     " User@BÜCHER.com "):
        found = ok(await client.get("/emails", params={"to": spelling}))["data"]
        assert [e["id"] for e in found] == [a_label], spelling
    for spelling in ("ann@xn--bcher-kva.com", "ANN@bücher.com"):
        found = ok(await client.get("/emails", params={"to": spelling}))["data"]
        assert [e["id"] for e in found] == [u_label], spelling
    # A value that is not an address matches nothing, as before.
    for other in ("user", "Ann <ann@bücher.com>", "@bücher.com"):
        assert ok(await client.get("/emails", params={"to": other}))["data"] == [], other
    assert_error(await client.get("/emails", params={"to": ""}), 400, "BAD_REQUEST")
