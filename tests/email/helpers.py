"""Helpers shared by the email tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from tidings.email.bounce_addresses import BounceKey
from tidings.email.records import return_path_host
from tidings.service import Service
from tidings.storage.email_outcomes import sent_email

SENDER = "Acme <hi@acme.example>"


def ok(response: httpx.Response, status: int = 200) -> Any:
    """The ``data`` of a success with ``status``."""
    assert response.status_code == status, response.text
    body = response.json()
    assert body["success"] is True, body
    return body["data"]


def later(**delta: float) -> str:
    """An RFC 3339 time that far ahead."""
    return (datetime.now(UTC) + timedelta(**delta)).isoformat().replace("+00:00", "Z")


async def send(client: httpx.AsyncClient, **fields: Any) -> str:
    """POST /emails with a minimal body and ``fields``; the new email's id."""
    body = {"from": SENDER, "to": "ada@example.com", "subject": "Hi", "html": "<p>Hi</p>"}
    body.update(fields)
    data = ok(await client.post("/emails", json=body), 202)
    assert data["object"] == "email"
    email_id: str = data["id"]
    return email_id


async def events(client: httpx.AsyncClient, email_id: str, **params: Any) -> list[dict[str, Any]]:
    data = ok(await client.get(f"/emails/{email_id}/events", params=params))
    assert set(data) == {"object", "data"}
    found: list[dict[str, Any]] = data["data"]
    return found


async def bounce_key(service: Service) -> BounceKey:
    """The service's key for bounce addresses."""
    return await service.emails.bounce_key()


async def bounce_addresses(service: Service, message_id: str) -> list[str]:
    """The bounce address of each recipient of the email with ``message_id``
    (``<id@domain>``), as the send worker makes them (recipients as sent, or
    as addressed when not sent yet); [] for an email Tidings does not know."""
    key = await bounce_key(service)
    async with service.db.acquire() as conn:
        row = await conn.fetchrow(
            "SELECT id, to_addresses FROM emails WHERE smtp_message_id = $1", message_id
        )
        if row is None:
            return []
        sent = await sent_email(conn, message_id)
    recipients = sorted(sent.sent_to.values()) if sent else list(row["to_addresses"])
    host = return_path_host(message_id.strip("<>").rpartition("@")[2])
    return [key.address(row["id"], r, host) for r in recipients]
