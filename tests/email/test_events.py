"""GET /emails/{id}/events: the event fields and the spec's paging rules."""

from __future__ import annotations

from datetime import datetime

import httpx
import pytest
import trio

from tests.conftest import assert_error
from tests.email.helpers import events, later, ok, send


@pytest.fixture
def client(client: httpx.AsyncClient, acme_domain: str) -> httpx.AsyncClient:
    """Team acme's client, once acme.example is its verified sending domain."""
    return client


async def many_events(client: httpx.AsyncClient, count: int) -> str:
    """An email with ``count`` events: suppressed recipients, then scheduled."""
    addresses = [f"gone{n}@example.com" for n in range(count - 1)]
    for address in addresses:
        ok(await client.post("/suppressions", json={"address": address, "reason": "manual"}), 201)
    recipients = [*addresses, "ada@example.com"]
    return await send(client, to=recipients[-1], cc=recipients[:50],
                      bcc=recipients[50:-1] or None, scheduled_at=later(hours=1))


async def test_event_fields(client: httpx.AsyncClient) -> None:
    email_id = await send(client, scheduled_at=later(hours=1))
    [event] = await events(client, email_id)
    assert set(event) == {"id", "type", "recipient", "occurred_at", "provider", "code", "message"}
    assert event["type"] == "scheduled"
    assert event["provider"] == "sandbox"
    assert event["recipient"] == "ada@example.com"
    assert event["occurred_at"].endswith("Z")


async def test_paging_defaults_to_100_and_falls_back_to_100(client: httpx.AsyncClient) -> None:
    email_id = await many_events(client, 101)
    assert len(await events(client, email_id)) == 100
    assert len(await events(client, email_id, limit=1000)) == 100
    assert len(await events(client, email_id, limit=101)) == 100
    newest = await events(client, email_id, limit=1)
    assert [e["type"] for e in newest] == ["scheduled"]
    everything = await events(client, email_id, limit=100, offset=0)
    rest = await events(client, email_id, offset=100)
    assert len(rest) == 1 and rest[0]["type"] == "suppressed"
    assert len({e["id"] for e in everything + rest}) == 101
    assert await events(client, email_id, offset=500) == []
    two = await events(client, email_id, limit=2, offset=1)
    assert [e["id"] for e in two] == [e["id"] for e in everything[1:3]]


async def test_paging_refuses_bad_values(client: httpx.AsyncClient) -> None:
    email_id = await send(client, scheduled_at=later(hours=1))
    for params in ({"limit": 0}, {"limit": -3}, {"limit": "1.5"}, {"limit": "x"},
                   {"offset": -1}, {"offset": "a"}, {"page": 2}):
        assert_error(
            await client.get(f"/emails/{email_id}/events", params=params), 400, "BAD_REQUEST"
        )


async def test_an_email_is_not_updated_before_its_last_event(client: httpx.AsyncClient) -> None:
    """``updated_at`` is never earlier than the event that changed the email."""
    for _ in range(3):
        email_id = await send(client)
        with trio.fail_after(10):
            while ok(await client.get(f"/emails/{email_id}"))["status"] != "delivered":
                await trio.sleep(0.05)
        email = ok(await client.get(f"/emails/{email_id}"))
        last = max(datetime.fromisoformat(e["occurred_at"]) for e in await events(client, email_id))
        assert datetime.fromisoformat(email["updated_at"]) >= last, (email, last)
    scheduled = await send(client, scheduled_at=later(hours=1))
    canceled = ok(await client.post(f"/emails/{scheduled}/cancel"))
    last = max(datetime.fromisoformat(e["occurred_at"]) for e in await events(client, scheduled))
    assert datetime.fromisoformat(canceled["updated_at"]) >= last


async def test_events_about_the_whole_email_name_its_to_as_the_others_do(
    client: httpx.AsyncClient
) -> None:
    """`recipient` (the webhook body's `to`) of a queued or scheduled event is
    the bare address, as in the events about that recipient."""
    email_id = await send(client, to="Bob <Bob2@Example.COM>")
    with trio.fail_after(10):
        while not any(e["type"] == "delivered" for e in await events(client, email_id)):
            await trio.sleep(0.05)
    by_type = {e["type"]: e["recipient"] for e in await events(client, email_id)}
    assert by_type["queued"] == by_type["sent"] == by_type["delivered"] == "Bob2@example.com"
    scheduled = await send(client, to=['"Doe, Jane" <jane@example.com>', "ada@example.com"],
                           scheduled_at=later(hours=1))
    [event] = await events(client, scheduled)
    assert event["recipient"] == "jane@example.com, ada@example.com"


async def test_no_event_of_an_email_is_older_than_the_email(client: httpx.AsyncClient) -> None:
    ok(await client.post("/suppressions", json={"address": "gone@example.com",
                                                "reason": "manual"}), 201)
    sent = [
        await send(client),  # queued
        await send(client, scheduled_at=later(hours=1)),
        await send(client, to=["ada@example.com", "gone@example.com"]),  # one suppressed
        await send(client, to="gone@example.com"),  # suppressed only
    ]
    batch = ok(await client.post("/emails/batch", json=[
        {"from": "Acme <hi@acme.example>", "to": f"r{n}@example.com", "subject": "Hi",
         "html": "<p>Hi</p>"} for n in range(3)
    ]), 202)
    sent += [item["id"] for item in batch["data"]]
    for email_id in sent:
        created = datetime.fromisoformat(ok(await client.get(f"/emails/{email_id}"))["created_at"])
        first = min(datetime.fromisoformat(e["occurred_at"])
                    for e in await events(client, email_id))
        assert created <= first, (email_id, created, first)
