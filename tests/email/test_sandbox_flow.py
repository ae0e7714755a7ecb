"""The sandbox's whole life of an email (CONTRACT §9): the send worker takes
queued emails, the outcomes follow by recipient within 2 seconds, bounces
and complaints suppress the address, and every step reaches a webhook
receiver as ``message.<type>``."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from tests.conftest import Credential
from tests.email.helpers import events, later, ok, send
from tests.webhooks.receiver import Receiver
from tidings.config import Config


@pytest.fixture
def config(database_url: str) -> Config:
    return Config(
        database_url=database_url, db_pool_size=6, rate_limit_per_second=0,
        shutdown_grace_seconds=2, webhook_allow_private_urls=True,
        webhook_poll_seconds=0.2, email_poll_seconds=0.2,
    )


@pytest.fixture
def client(client: httpx.AsyncClient, acme_domain: str) -> httpx.AsyncClient:
    return client


async def settled(
    client: httpx.AsyncClient, email_id: str, status: str, within: float = 10
) -> dict[str, Any]:
    with trio.fail_after(within):
        while True:
            email: dict[str, Any] = ok(await client.get(f"/emails/{email_id}"))
            if email["status"] == status:
                return email
            await trio.sleep(0.05)


async def types_of(client: httpx.AsyncClient, email_id: str) -> list[str]:
    return [e["type"] for e in reversed(await events(client, email_id))]


async def test_each_recipient_gets_its_scripted_outcome(client: httpx.AsyncClient) -> None:
    started = trio.current_time()
    cases = {
        "ada@example.com": ("delivered", ["queued", "sent", "delivered"]),
        "bounced@example.com": ("bounced", ["queued", "sent", "bounced"]),
        "complained+7@example.com": ("complained", ["queued", "sent", "complained"]),
        "failed@example.com": ("failed", ["queued", "sent", "failed"]),
        "delayed@example.com": (
            "delivered", ["queued", "sent", "delivery_delayed", "delivered"]
        ),
    }
    ids = {address: await send(client, to=address) for address in cases}
    for address, (status, expected) in cases.items():
        await settled(client, ids[address], status)
        assert await types_of(client, ids[address]) == expected, address
    assert trio.current_time() - started < 5
    bounced = await events(client, ids["bounced@example.com"])
    assert bounced[0]["code"] == "550" and bounced[0]["provider"] == "sandbox"
    assert bounced[0]["recipient"] == "bounced@example.com"

    listed = ok(await client.get("/suppressions"))["data"]
    assert {(s["address"], s["reason"]) for s in listed} == {
        ("bounced@example.com", "bounce"), ("complained+7@example.com", "complaint"),
    }
    # The suppressed address is not sent to again: the email is accepted, the
    # recipient gets a suppressed event, and nothing is sent.
    again = await send(client, to="bounced@example.com")
    email = ok(await client.get(f"/emails/{again}"))
    assert email["status"] == "suppressed"
    assert await types_of(client, again) == ["suppressed"]


async def test_a_suppressed_recipient_is_left_out_and_the_rest_are_sent(
    client: httpx.AsyncClient,
) -> None:
    ok(await client.post("/suppressions", json={"address": "gone@example.com",
                                                "reason": "manual"}), 201)
    email_id = await send(client, to=["Gone <GONE@example.com>", "ada@example.com"])
    await settled(client, email_id, "delivered")
    found = list(reversed(await events(client, email_id)))
    assert [(e["type"], e["recipient"]) for e in found] == [
        ("suppressed", "GONE@example.com"),
        ("queued", "GONE@example.com, ada@example.com"),
        ("sent", "ada@example.com"),
        ("delivered", "ada@example.com"),
    ]


async def test_a_scheduled_email_goes_when_due_and_a_rescheduled_one_waits(
    client: httpx.AsyncClient, service: Any,
) -> None:
    soon = await send(client, scheduled_at=later(seconds=1))
    moved = await send(client, scheduled_at=later(seconds=1))
    ok(await client.patch(f"/emails/{moved}", json={"scheduled_at": later(hours=1)}))
    await settled(client, soon, "delivered")
    # Fallen due it is queued, as an email sent at once is when accepted.
    assert await types_of(client, soon) == ["scheduled", "queued", "sent", "delivered"]
    assert ok(await client.get(f"/emails/{moved}"))["status"] == "scheduled"


async def test_every_step_reaches_a_webhook_receiver(
    client: httpx.AsyncClient, nursery: trio.Nursery, acme: Credential
) -> None:
    receiver = Receiver()
    await nursery.start(receiver.serve)
    ok(await client.post("/webhook-endpoints", json={"url": receiver.url, "events": ["*"]}), 201)
    email_id = await send(client, to="bounced@example.com")
    received = await receiver.wait_for(3)
    bodies = sorted((r.event for r in received), key=lambda e: e["occurred_at"])
    assert [b["event"] for b in bodies] == ["message.queued", "message.sent", "message.bounced"]
    assert [r.headers["x-service-event"] for r in sorted(
        received, key=lambda r: r.event["occurred_at"])] == [b["event"] for b in bodies]
    for body in bodies:
        assert body["message_id"] == email_id
        assert body["channel"] == "email"
        assert body["to"] == "bounced@example.com"
        assert body["data"]["email_id"] == email_id
        assert body["data"]["subject"] == "Hi"
        # Every key, null where it does not apply (an email of no broadcast,
        # the provider's words of an outcome only).
        assert set(body["data"]) == {"email_id", "from", "to", "subject", "broadcast_id",
                                      "provider", "code", "message"}
        assert body["data"]["broadcast_id"] is None and body["data"]["provider"] == "sandbox"
    assert bodies[0]["data"]["code"] is None and bodies[0]["data"]["message"] is None
    assert bodies[-1]["data"]["code"] is not None
    ids = {e["id"] for e in await events(client, email_id)}
    assert {b["id"] for b in bodies} == ids


async def test_a_bounced_address_is_suppressed_in_every_spelling(
    client: httpx.AsyncClient,
) -> None:
    """One fold of case (PostgreSQL's) for storing and checking: a capital
    that Python and PostgreSQL lowercase differently (İ) is still caught.
    Mail cannot be sent to an address outside ASCII before the @ (400), but
    the suppression list may hold one, and it catches what folds to it."""
    first = await send(client, to="bounced+Ix@example.com")
    await settled(client, first, "bounced")
    ok(await client.post("/suppressions", json={"address": "bounced+İy@example.com"}), 201)
    for spelling in ("bounced+Ix@example.com", "BOUNCED+IX@example.com", "bounced+ix@example.com",
                     "bounced+iy@example.com", "BOUNCED+IY@example.com"):
        again = await send(client, to=spelling)
        assert ok(await client.get(f"/emails/{again}"))["status"] == "suppressed", spelling
        assert await types_of(client, again) == ["suppressed"]
    refused = await client.post("/emails", json={
        "from": "Acme <hi@acme.example>", "to": "bounced+İx@example.com", "subject": "Hi",
        "text": "Hi",
    })
    assert refused.status_code == 400 and "SMTPUTF8" in refused.json()["error"]["message"]
