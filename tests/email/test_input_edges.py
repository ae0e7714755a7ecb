"""POST /emails input at its edges: every ``ARC-*`` header is refused, a
display name refuses the characters a subject refuses, a subject of spaces
alone is refused, and an empty ``cc``, ``bcc`` or ``reply_to`` list is none."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import assert_error
from tests.email.helpers import SENDER, ok, send


@pytest.fixture
def client(client: httpx.AsyncClient, acme_domain: str) -> httpx.AsyncClient:
    return client


BODY = {"from": SENDER, "to": "ada@example.com", "subject": "Hi", "html": "<p>Hi</p>"}


@pytest.mark.parametrize("name", ["ARC-Foo", "arc-seal", "Arc-Message-Signature", "ARC-"])
async def test_every_arc_header_is_refused(client: httpx.AsyncClient, name: str) -> None:
    refused = await client.post("/emails", json={**BODY, "headers": {name: "x"}})
    message = assert_error(refused, 400, "BAD_REQUEST")
    assert message == f"headers.{name}: Tidings sets this header itself; it cannot be given"


async def test_headers_merely_like_arc_are_fine(client: httpx.AsyncClient) -> None:
    headers = {"X-ARC-Foo": "x", "Arcade": "y"}
    email_id = await send(client, headers=headers)
    assert ok(await client.get(f"/emails/{email_id}"))["headers"] == headers


@pytest.mark.parametrize("subject", [" ", "   ", "\u00a0", "\u3000 \u2003"])
async def test_a_subject_of_spaces_alone_is_refused(
    client: httpx.AsyncClient, subject: str
) -> None:
    refused = await client.post("/emails", json={**BODY, "subject": subject})
    message = assert_error(refused, 400, "BAD_REQUEST")
    assert "subject: holds no visible character" in message
    batch = await client.post("/emails/batch", json=[BODY, {**BODY, "subject": subject}])
    assert "1: subject: holds no visible character" in assert_error(batch, 400, "BAD_REQUEST")
    assert ok(await client.get("/emails"))["data"] == []


async def test_a_subject_with_spaces_around_a_word_is_kept(client: httpx.AsyncClient) -> None:
    email_id = await send(client, subject="  Hi  there ")
    assert ok(await client.get(f"/emails/{email_id}"))["subject"] == "  Hi  there "


@pytest.mark.parametrize("char", ["\u2028", "\u2029", "\x85", "\x9b"])
@pytest.mark.parametrize("field", ["from", "to", "cc", "bcc", "reply_to"])
async def test_a_display_name_refuses_separators_and_c1_controls(
    client: httpx.AsyncClient, field: str, char: str
) -> None:
    value = f"Ann{char}Lee <ann@acme.example>"
    refused = await client.post("/emails", json={**BODY, field: value})
    message = assert_error(refused, 400, "BAD_REQUEST")
    assert message.startswith(f"{field}: ") and "control characters are not allowed" in message
    # The same as a subject with it.
    subject = await client.post("/emails", json={**BODY, "subject": f"Ann{char}Lee"})
    assert "control characters are not allowed" in assert_error(subject, 400, "BAD_REQUEST")


async def test_an_empty_list_is_none(client: httpx.AsyncClient) -> None:
    email_id = await send(client, cc=[], bcc=[], reply_to=[])
    shown = ok(await client.get(f"/emails/{email_id}"))
    assert (shown["cc"], shown["bcc"], shown["reply_to"]) == ([], [], [])
    # As null is: a template's reply-to still applies.
    created = ok(await client.post("/templates", json={
        "name": "Note", "alias": "note", "subject": "Hi", "html": "<p>x</p>",
        "reply_to": "help@acme.example",
    }), 201)
    ok(await client.post(f"/templates/{created['id']}/publish"))
    for reply_to in ([], None):
        email_id = await send(client, subject=None, html=None, reply_to=reply_to,
                              template={"alias": "note"})
        assert ok(await client.get(f"/emails/{email_id}"))["reply_to"] == ["help@acme.example"]
    # ``to`` still needs one address.
    refused = await client.post("/emails", json={**BODY, "to": []})
    assert_error(refused, 400, "BAD_REQUEST")


@pytest.mark.parametrize(("to", "expected"), [
    (5, "invalid body: to: Input should be a valid string or Input should be a valid array"),
    ([], "invalid body: to: List should have at least 1 item after validation, not 0"),
    (["ada@example.com"] * 51,
     "invalid body: to: List should have at most 50 items after validation, not 51"),
    (["ada@example.com", 5], "invalid body: to.1: Input should be a valid string"),
])
async def test_a_field_of_two_shapes_is_named_as_sent(
    client: httpx.AsyncClient, to: object, expected: str
) -> None:
    """``to`` is an address or a list: the error names the field as the
    request has it (never a side of the type, ``to.list[str]``), and a list
    is told what is wrong with the list, not that it is not a string."""
    refused = await client.post("/emails", json={**BODY, "to": to})
    assert assert_error(refused, 400, "BAD_REQUEST") == expected
