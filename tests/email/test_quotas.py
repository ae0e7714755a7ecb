"""POST /emails counts every recipient it sends to against the team's quotas."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import Credential, assert_error
from tests.email.helpers import SENDER, ok, send
from tidings.service import Service
from tidings.storage import quotas
from tidings.storage.quotas import LimitChange


@pytest.fixture
def client(client: httpx.AsyncClient, acme_domain: str) -> httpx.AsyncClient:
    return client


async def limit_emails_per_day(service: Service, team: Credential, limit: int) -> None:
    async with service.db.acquire() as conn:
        await quotas.set_limits(conn, team.team_id, [LimitChange("email", "day", limit)])


async def test_a_send_past_the_daily_quota_is_402_and_stores_nothing(
    client: httpx.AsyncClient, service: Service, acme: Credential
) -> None:
    await limit_emails_per_day(service, acme, 3)
    await send(client, to=["a@example.com", "b@example.com"])
    # Two more recipients would make four: refused whole, nothing stored.
    body = {"from": SENDER, "to": ["c@example.com"], "cc": ["d@example.com"],
            "subject": "Hi", "html": "<p>Hi</p>"}
    message = assert_error(await client.post("/emails", json=body), 402, "PAYMENT_REQUIRED")
    assert "3 emails per day" in message and "resets at" in message
    listed = ok(await client.get("/emails"))["data"]
    assert len(listed) == 1
    # One more recipient fits exactly.
    await send(client, to="c@example.com")
    response = await client.post("/emails", json={**body, "to": "e@example.com", "cc": None})
    assert_error(response, 402, "PAYMENT_REQUIRED")
    assert response.headers.get("Retry-After")


async def test_a_batch_counts_every_recipient_of_every_email(
    client: httpx.AsyncClient, service: Service, acme: Credential
) -> None:
    await limit_emails_per_day(service, acme, 2)
    item = {"from": SENDER, "to": "a@example.com", "subject": "Hi", "html": "<p>Hi</p>"}
    response = await client.post("/emails/batch", json=[item, item, item])
    assert_error(response, 402, "PAYMENT_REQUIRED")
    ok(await client.post("/emails/batch", json=[item, item]), 202)


async def test_suppressed_recipients_do_not_count(
    client: httpx.AsyncClient, service: Service, acme: Credential
) -> None:
    await limit_emails_per_day(service, acme, 1)
    ok(await client.post("/suppressions", json={"address": "gone@example.com"}), 201)
    await send(client, to=["gone@example.com", "ada@example.com"])
