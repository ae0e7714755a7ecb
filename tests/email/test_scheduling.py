"""Scheduling: scheduled_at holds an email; PATCH moves it; cancel stops it;
both only while it is scheduled (409 after)."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import assert_error
from tests.email.helpers import events, later, ok, send


@pytest.fixture
def client(client: httpx.AsyncClient, acme_domain: str) -> httpx.AsyncClient:
    """Team acme's client, once acme.example is its verified sending domain."""
    return client


async def test_a_scheduled_email_waits_with_a_scheduled_event(client: httpx.AsyncClient) -> None:
    email_id = await send(client, scheduled_at=later(hours=2))
    email = ok(await client.get(f"/emails/{email_id}"))
    assert email["status"] == "scheduled"
    assert [e["type"] for e in await events(client, email_id)] == ["scheduled"]


async def test_reschedule_moves_the_send(client: httpx.AsyncClient) -> None:
    email_id = await send(client, scheduled_at=later(hours=2))
    when = later(days=3)
    email = ok(await client.patch(f"/emails/{email_id}", json={"scheduled_at": when}))
    assert email["status"] == "scheduled"
    assert email["scheduled_at"][:19] == when[:19]
    assert ok(await client.get(f"/emails/{email_id}"))["scheduled_at"][:19] == when[:19]


async def test_reschedule_checks_the_time(client: httpx.AsyncClient) -> None:
    email_id = await send(client, scheduled_at=later(hours=2))
    for when in (later(minutes=-5), later(days=31)):
        assert_error(
            await client.patch(f"/emails/{email_id}", json={"scheduled_at": when}),
            422, "UNPROCESSABLE_ENTITY",
        )
    for body in ({}, {"scheduled_at": "soon"}, {"scheduled_at": None}):
        assert_error(await client.patch(f"/emails/{email_id}", json=body), 400, "BAD_REQUEST")


async def test_cancel_records_canceled_and_then_refuses_with_409(
    client: httpx.AsyncClient,
) -> None:
    email_id = await send(client, scheduled_at=later(hours=2))
    email = ok(await client.post(f"/emails/{email_id}/cancel"))
    assert email["status"] == "canceled"
    assert [e["type"] for e in await events(client, email_id)] == ["canceled", "scheduled"]
    assert_error(await client.post(f"/emails/{email_id}/cancel"), 409, "CONFLICT")
    assert_error(
        await client.patch(f"/emails/{email_id}", json={"scheduled_at": later(hours=3)}),
        409, "CONFLICT",
    )


async def test_an_email_sent_now_cannot_be_canceled_or_rescheduled(
    client: httpx.AsyncClient,
) -> None:
    email_id = await send(client)
    assert_error(await client.post(f"/emails/{email_id}/cancel"), 409, "CONFLICT")
    assert_error(
        await client.patch(f"/emails/{email_id}", json={"scheduled_at": later(hours=3)}),
        409, "CONFLICT",
    )
