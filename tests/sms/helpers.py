"""Helpers shared by the SMS tests."""

from __future__ import annotations

from typing import Any

import httpx
import trio

from tests.email.helpers import later, ok

__all__ = ["NUMBER", "SENDER", "later", "ok", "send", "settled"]

SENDER = "Acme"
# A valid US number (the sandbox delivers to it); ...0001/0002/0003 script outcomes.
NUMBER = "+14155550123"


async def send(client: httpx.AsyncClient, **fields: Any) -> dict[str, Any]:
    """POST /sms with a minimal body and ``fields``; the new message."""
    body = {"from": SENDER, "to": NUMBER, "body": "Hello from Acme"}
    body.update(fields)
    data: dict[str, Any] = ok(await client.post("/sms", json=body), 202)
    assert data["object"] == "sms"
    return data


async def settled(
    client: httpx.AsyncClient, sms_id: str, status: str, within: float = 10
) -> dict[str, Any]:
    with trio.fail_after(within):
        while True:
            sms: dict[str, Any] = ok(await client.get(f"/sms/{sms_id}"))
            if sms["last_event"] == status:
                return sms
            await trio.sleep(0.05)


async def event_types(client: httpx.AsyncClient, sms_id: str) -> list[str]:
    """The webhook events recorded for the message, oldest first."""
    listed = ok(await client.get("/events", params={"limit": 100}))["data"]
    mine = [e for e in listed if e["message_id"] == sms_id]
    return [e["type"] for e in sorted(mine, key=lambda e: e["occurred_at"])]
