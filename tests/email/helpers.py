"""Helpers shared by the email tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

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
