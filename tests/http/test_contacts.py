"""POST /contacts and GET /contacts/{id}: the first resource, end to end over HTTP."""

from __future__ import annotations

import uuid

import httpx


async def test_create_then_get(client: httpx.AsyncClient) -> None:
    created = await client.post(
        "/contacts",
        json={"email": "ada@example.com", "first_name": "Ada", "phone": "+44 20 7946 0958"},
    )
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["success"] is True
    contact = body["data"]
    assert contact["email"] == "ada@example.com"
    assert contact["first_name"] == "Ada"
    assert contact["normalized_phone"] == "+442079460958"
    assert contact["phone_country"] == "GB"
    assert contact["sms_consent_status"] == "unknown"
    assert contact["unsubscribed"] is False
    assert contact["properties"] == {}
    uuid.UUID(contact["id"])
    assert contact["created_at"].endswith("Z")

    fetched = await client.get(f"/contacts/{contact['id']}")
    assert fetched.status_code == 200
    assert fetched.json() == {"success": True, "data": contact}
