"""The email routes: send, batch, get, list with filters, and the error cases."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from tests.conftest import MakeToken, assert_error
from tests.email.helpers import SENDER, events, later, ok, send


@pytest.fixture
def client(client: httpx.AsyncClient, acme_domain: str) -> httpx.AsyncClient:
    """Team acme's client, once acme.example is its verified sending domain."""
    return client


async def test_send_answers_202_with_object_and_id(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/emails",
        json={"from": SENDER, "to": "ada@example.com", "subject": "Hi", "text": "Hello"},
    )
    data = ok(response, 202)
    assert set(data) == {"object", "id"}
    assert data["object"] == "email"
    uuid.UUID(data["id"])
    # null is none for headers and tags, as for cc, bcc and reply_to.
    nulls = ok(await client.post("/emails", json={
        "from": SENDER, "to": "ada@example.com", "subject": "Hi", "text": "Hello",
        "cc": None, "bcc": None, "reply_to": None, "headers": None, "tags": None}), 202)
    shown = ok(await client.get(f"/emails/{nulls['id']}"))
    assert (shown["headers"], shown["tags"], shown["cc"]) == ({}, [], [])


async def test_get_shows_every_field(client: httpx.AsyncClient) -> None:
    email_id = await send(
        client,
        to=["Ada Lovelace <ada@example.com>", "bob@example.com"],
        cc="carol@example.com",
        bcc=["dan@example.com"],
        reply_to="help@acme.example",
        subject="Your order",
        html="<p>Shipped</p>",
        text="Shipped",
        headers={"X-Order": "42", "List-Unsubscribe": "<mailto:u@acme.example>"},
        tags=[{"name": "category", "value": "order"}],
        scheduled_at=later(hours=1),
    )
    email = ok(await client.get(f"/emails/{email_id}"))
    assert email["object"] == "email"
    assert email["id"] == email_id
    assert email["from"] == SENDER
    assert email["to"] == ["Ada Lovelace <ada@example.com>", "bob@example.com"]
    assert email["cc"] == ["carol@example.com"]
    assert email["bcc"] == ["dan@example.com"]
    assert email["reply_to"] == ["help@acme.example"]
    assert email["subject"] == "Your order"
    assert email["html"] == "<p>Shipped</p>"
    assert email["text"] == "Shipped"
    assert email["headers"] == {"X-Order": "42", "List-Unsubscribe": "<mailto:u@acme.example>"}
    assert email["tags"] == [{"name": "category", "value": "order"}]
    assert email["status"] == "scheduled"
    assert email["scheduled_at"].endswith("Z")
    for name in ("created_at", "updated_at"):
        assert email[name].endswith("Z")


async def test_batch_accepts_all_in_order_or_none(client: httpx.AsyncClient) -> None:
    items = [
        {"from": SENDER, "to": f"r{n}@example.com", "subject": f"#{n}", "text": "x",
         "scheduled_at": later(hours=1)}
        for n in range(3)
    ]
    data = ok(await client.post("/emails/batch", json=items), 202)
    assert data["object"] == "list" and data["has_more"] is False  # CONTRACT §2's list shape
    ids = [item["id"] for item in data["data"]]
    assert len(ids) == 3 and all(item["object"] == "email" for item in data["data"])
    for n, email_id in enumerate(ids):
        assert ok(await client.get(f"/emails/{email_id}"))["subject"] == f"#{n}"

    bad = [*items, {"from": SENDER, "to": "not an address", "subject": "x", "text": "x"}]
    message = assert_error(await client.post("/emails/batch", json=bad), 400, "BAD_REQUEST")
    assert message.startswith("3.to")
    listed = ok(await client.get("/emails"))["data"]
    assert len(listed) == 3


async def test_batch_holds_at_most_100(client: httpx.AsyncClient) -> None:
    item = {"from": SENDER, "to": "a@example.com", "subject": "x", "text": "x"}
    assert_error(await client.post("/emails/batch", json=[item] * 101), 400, "BAD_REQUEST")
    assert_error(await client.post("/emails/batch", json=[]), 400, "BAD_REQUEST")


async def test_list_filters_by_status_to_and_dates(client: httpx.AsyncClient) -> None:
    first = await send(client, to="ada@example.com", scheduled_at=later(hours=1))
    second = await send(client, to=["Bob <Bob@Example.com>", "x@example.com"],
                        scheduled_at=later(hours=1))
    ok(await client.post(f"/emails/{first}/cancel"))

    listed = ok(await client.get("/emails"))
    assert [e["id"] for e in listed["data"]] == [second, first]
    assert listed["has_more"] is False
    page = ok(await client.get("/emails", params={"limit": 1}))
    assert [e["id"] for e in page["data"]] == [second] and page["has_more"] is True

    by_status = ok(await client.get("/emails", params={"status": "canceled"}))["data"]
    assert [e["id"] for e in by_status] == [first]
    by_to = ok(await client.get("/emails", params={"to": "bob@example.com"}))["data"]
    assert [e["id"] for e in by_to] == [second]

    created = ok(await client.get(f"/emails/{second}"))["created_at"]
    after = ok(await client.get("/emails", params={"start_date": created}))["data"]
    assert [e["id"] for e in after] == [second]
    before = ok(await client.get("/emails", params={"end_date": created}))["data"]
    assert {e["id"] for e in before} == {first, second}
    # Kept to microseconds: a start 1 ns after the creation excludes it.
    assert created.endswith("Z") and len(created) == len("2026-01-01T00:00:00.123456Z")
    one_ns_later = created[:-1] + "001Z"
    assert ok(await client.get("/emails", params={"start_date": one_ns_later}))["data"] == []
    late = await client.get("/emails", params={"start_date": "9999-12-31T23:59:59.9999999Z"})
    assert late.status_code == 400 and "start_date" in late.json()["error"]["message"]
    assert ok(await client.get("/emails", params={"end_date": "2000-01-01T00:00:00Z"}))[
        "data"
    ] == []


async def test_the_to_filter_reads_an_address_as_a_send_does(client: httpx.AsyncClient) -> None:
    spellings = ['"quoted"@example.com', "<angle@example.com>",
                 "<@relay.example:routed@example.com>"]
    sent = {
        spelling: ok(await client.post("/emails", json={
            "from": SENDER, "to": spelling, "subject": "x", "text": "x",
            "scheduled_at": later(hours=1)}), 202)["id"]
        for spelling in spellings
    }
    for spelling, email_id in sent.items():
        for asked in (spelling, spelling.upper()):
            found = ok(await client.get("/emails", params={"to": asked}))["data"]
            assert [e["id"] for e in found] == [email_id], asked
    # A mailbox with a display name is not an address: it matches nothing.
    named = ok(await client.get("/emails", params={"to": "Ann <angle@example.com>"}))["data"]
    assert named == []


async def test_list_refuses_bad_filters(client: httpx.AsyncClient) -> None:
    for params in (
        {"status": "lost"},
        {"limit": 0},
        {"limit": "ten"},
        {"offset": -1},
        {"start_date": "yesterday"},
        {"start_date": "1700000000"},
        {"start_date": "0001-01-01T00:00:00+14:00"},
        {"end_date": "9999-12-31T23:59:59-12:00"},
        {"start_date": "2024-01-02T00:00:00Z", "end_date": "2024-01-01T00:00:00Z"},
    ):
        assert_error(await client.get("/emails", params=params), 400, "BAD_REQUEST")


BAD_BODIES: list[tuple[dict[str, Any], str]] = [
    ({"to": "a@example.com", "subject": "x", "text": "x"}, "from"),
    ({"from": "nobody", "to": "a@example.com", "subject": "x", "text": "x"}, "from"),
    ({"from": SENDER, "subject": "x", "text": "x"}, "to"),
    ({"from": SENDER, "to": [], "subject": "x", "text": "x"}, "to"),
    ({"from": SENDER, "to": [f"r{n}@example.com" for n in range(51)], "subject": "x",
      "text": "x"}, "to"),
    ({"from": SENDER, "to": "a@example.com", "cc": "bad", "subject": "x", "text": "x"}, "cc"),
    ({"from": SENDER, "to": "a@example.com", "text": "x"}, "subject"),
    ({"from": SENDER, "to": "a@example.com", "subject": "x"}, "html"),
    ({"from": SENDER, "to": "a@example.com", "subject": "a\nBcc: x@evil.example",
      "text": "x"}, "subject"),
    ({"from": SENDER, "to": "a@example.com", "subject": "x", "text": "x",
      "headers": {"Bcc": "x@evil.example"}}, "headers.Bcc"),
    ({"from": SENDER, "to": "a@example.com", "subject": "x", "text": "x",
      "headers": {"DKIM-Signature": "v=1"}}, "headers.DKIM-Signature"),
    ({"from": SENDER, "to": "a@example.com", "subject": "x", "text": "x",
      "headers": {"X-A": "1\r\nBcc: x@evil.example"}}, "headers.X-A"),
    ({"from": SENDER, "to": "a@example.com", "subject": "ctl\x1b[2J\x7f\x08end",
      "text": "x"}, "subject"),
    ({"from": SENDER, "to": "a@example.com", "subject": "x", "text": "x",
      "headers": {"X-Ctl": "a\x0bb\x1bc"}}, "headers.X-Ctl"),
    ({"from": SENDER, "to": "a@example.com", "subject": "one\u2028two", "text": "x"},
     "subject"),
    ({"from": SENDER, "to": "a@example.com", "subject": "x", "text": "x",
      "tags": [{"name": "a b", "value": "x"}]}, "tags"),
    ({"from": SENDER, "to": "a@example.com", "subject": "x", "text": "x",
      "scheduled_at": "2030-01-01T00:00:00"}, "scheduled_at"),
    ({"from": SENDER, "to": "a@example.com", "subject": "x", "text": "x", "extra": 1}, "extra"),
    ({"from": SENDER, "to": "a@example.com", "subject": "x", "text": "x",
      "template": {"id": "welcome"}}, "text"),
]


async def test_send_names_the_offending_field(client: httpx.AsyncClient) -> None:
    for body, field in BAD_BODIES:
        message = assert_error(await client.post("/emails", json=body), 400, "BAD_REQUEST")
        assert field in message, (body, message)
    assert ok(await client.get("/emails"))["data"] == []


async def test_scheduled_at_in_the_past_or_too_far_is_422(client: httpx.AsyncClient) -> None:
    base = {"from": SENDER, "to": "a@example.com", "subject": "x", "text": "x"}
    for when in (later(minutes=-1), later(days=31)):
        message = assert_error(
            await client.post("/emails", json={**base, "scheduled_at": when}),
            422, "UNPROCESSABLE_ENTITY",
        )
        assert "scheduled_at" in message


async def test_another_teams_email_is_404(
    client: httpx.AsyncClient, make_token: MakeToken, base_url: str
) -> None:
    email_id = await send(client, scheduled_at=later(hours=1))
    other = await make_token(team="globex")
    async with httpx.AsyncClient(base_url=base_url, headers=other.headers) as theirs:
        assert_error(await theirs.get(f"/emails/{email_id}"), 404, "NOT_FOUND")
        assert_error(await theirs.get(f"/emails/{email_id}/events"), 404, "NOT_FOUND")
        assert_error(await theirs.post(f"/emails/{email_id}/cancel"), 404, "NOT_FOUND")
        assert_error(
            await theirs.patch(f"/emails/{email_id}", json={"scheduled_at": later(hours=2)}),
            404, "NOT_FOUND",
        )
        assert ok(await theirs.get("/emails"))["data"] == []
    assert_error(await client.get(f"/emails/{uuid.uuid4()}"), 404, "NOT_FOUND")
    assert_error(await client.get("/emails/not-a-uuid"), 400, "BAD_REQUEST")


async def test_permissions(make_token: MakeToken, base_url: str, acme_domain: str) -> None:
    reader = await make_token(permissions=["email:read"])
    sender = await make_token(permissions=["email:send"])
    body = {"from": SENDER, "to": "a@example.com", "subject": "x", "text": "x",
            "scheduled_at": later(hours=1)}
    async with (
        httpx.AsyncClient(base_url=base_url, headers=reader.headers) as reading,
        httpx.AsyncClient(base_url=base_url, headers=sender.headers) as sending,
    ):
        assert_error(await reading.post("/emails", json=body), 403, "FORBIDDEN")
        assert_error(await reading.post("/emails/batch", json=[body]), 403, "FORBIDDEN")
        email_id = ok(await sending.post("/emails", json=body), 202)["id"]
        assert_error(await sending.get("/emails"), 403, "FORBIDDEN")
        assert_error(await sending.get(f"/emails/{email_id}"), 403, "FORBIDDEN")
        assert_error(await sending.get(f"/emails/{email_id}/events"), 403, "FORBIDDEN")
        assert_error(
            await reading.patch(f"/emails/{email_id}", json={"scheduled_at": later(hours=2)}),
            403, "FORBIDDEN",
        )
        assert_error(await reading.post(f"/emails/{email_id}/cancel"), 403, "FORBIDDEN")
        assert ok(await reading.get(f"/emails/{email_id}"))["status"] == "scheduled"
        assert len(await events(reading, email_id)) == 1
        ok(await sending.post(f"/emails/{email_id}/cancel"))


async def test_from_must_be_on_a_verified_domain_of_the_team(
    client: httpx.AsyncClient, make_token: MakeToken, base_url: str
) -> None:
    base = {"to": "a@example.com", "subject": "x", "text": "x"}
    for sender in ("hi@elsewhere.example", "Acme <hi@sub.acme.example>"):
        message = assert_error(
            await client.post("/emails", json={**base, "from": sender}),
            422, "UNPROCESSABLE_ENTITY",
        )
        assert message.startswith("from:")
    pending = ok(await client.post("/domains", json={"name": "pending.example"}), 201)
    assert pending["status"] == "pending"
    assert_error(
        await client.post("/emails", json={**base, "from": "hi@pending.example"}),
        422, "UNPROCESSABLE_ENTITY",
    )
    # Another team's verified domain is not this team's.
    other = await make_token(team="globex")
    async with httpx.AsyncClient(base_url=base_url, headers=other.headers) as theirs:
        assert_error(
            await theirs.post("/emails", json={**base, "from": SENDER}),
            422, "UNPROCESSABLE_ENTITY",
        )
    batch = [{**base, "from": SENDER}, {**base, "from": "hi@elsewhere.example"}]
    message = assert_error(
        await client.post("/emails/batch", json=batch), 422, "UNPROCESSABLE_ENTITY"
    )
    assert message.startswith("1.from")
    assert ok(await client.get("/emails"))["data"] == []
    # The domain matches in any case.
    await send(client, **{"from": "HI@ACME.EXAMPLE"})
