"""Delivery reports that arrive later: a real DSN and a real ARF report,
posted raw, become ``bounced``/``complained`` events and suppressions."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import pytest
import trio

from tests.conftest import assert_error
from tests.email.helpers import SENDER, events, ok
from tidings.config import Config
from tidings.service import Service

SECRET = "reports-secret-1"
REPORTS = Path(__file__).parent / "reports"


@pytest.fixture
def config(database_url: str) -> Config:
    return Config(
        database_url=database_url, db_pool_size=6, rate_limit_per_second=0,
        shutdown_grace_seconds=2, email_poll_seconds=0.2, reports_secret=SECRET,
    )


async def delivered_email(
    client: httpx.AsyncClient, service: Service, *to: str
) -> tuple[str, str]:
    """An email sent (sandbox) and delivered to ``to``; its id and Message-ID."""
    data = ok(await client.post(
        "/emails", json={"from": SENDER, "to": list(to), "subject": "Your receipt", "html": "x"}
    ), 202)
    with trio.fail_after(10):
        while ok(await client.get(f"/emails/{data['id']}"))["status"] != "delivered":
            await trio.sleep(0.05)
    async with service.db.acquire() as conn:
        message_id = await conn.fetchval(
            "SELECT smtp_message_id FROM emails WHERE id = $1", UUID(data["id"])
        )
    return data["id"], message_id


async def post_report(http: httpx.AsyncClient, raw: bytes, secret: str = SECRET) -> Any:
    return await http.post(
        "/providers/smtp/reports", content=raw,
        headers={"Authorization": f"Bearer {secret}", "Content-Type": "message/rfc822"},
    )


def report(name: str, message_id: str) -> bytes:
    return (REPORTS / name).read_bytes().replace(b"<MESSAGE_ID>", message_id.encode())


async def suppressions(client: httpx.AsyncClient) -> dict[str, str]:
    listed = ok(await client.get("/suppressions"))["data"]
    return {s["address"]: s["reason"] for s in listed}


async def test_dsn_bounces_and_suppresses(
    client: httpx.AsyncClient, http: httpx.AsyncClient, service: Service, acme_domain: str
) -> None:
    email_id, message_id = await delivered_email(
        client, service, "gone@example.org", "slow@example.org"
    )
    answer = ok(await post_report(http, report("postfix_bounce.eml", message_id)))
    assert answer["recorded"] == 2
    assert [(r["recipient"], r["outcome"], r["code"]) for r in answer["reports"]] == [
        ("gone@example.org", "bounced", "5.1.1"), ("slow@example.org", "delivery_delayed", "4.4.1")
    ]
    found = await events(client, email_id)
    bounced = [e for e in found if e["type"] == "bounced"]
    assert len(bounced) == 1
    assert "User unknown" in str(bounced[0])
    assert any(e["type"] == "delivery_delayed" for e in found)
    assert await suppressions(client) == {"gone@example.org": "hard_bounce"}


async def test_arf_complaint_suppresses(
    client: httpx.AsyncClient, http: httpx.AsyncClient, service: Service, acme_domain: str
) -> None:
    email_id, message_id = await delivered_email(client, service, "ada@example.org")
    answer = ok(await post_report(http, report("abuse_report.eml", message_id)))
    assert answer["recorded"] == 1
    assert ok(await client.get(f"/emails/{email_id}"))["status"] == "complained"
    assert [e["type"] for e in await events(client, email_id)][0] == "complained"
    assert await suppressions(client) == {"ada@example.org": "complaint"}


async def test_unknown_message_and_refusals(
    client: httpx.AsyncClient, http: httpx.AsyncClient
) -> None:
    answer = ok(await post_report(http, report("abuse_report.eml", "<nobody@acme.example>")))
    assert answer["recorded"] == 0 and answer["reports"][0]["recorded"] is False
    assert await suppressions(client) == {}
    raw = report("abuse_report.eml", "<x@acme.example>")
    assert_error(await post_report(http, raw, "wrong"), 403, "FORBIDDEN")
    assert_error(await http.post("/providers/smtp/reports", content=raw), 403, "FORBIDDEN")
    message = assert_error(
        await post_report(http, b"From: a@b.example\n\nhello\n"), 422, "UNPROCESSABLE_ENTITY"
    )
    assert "multipart/report" in message
