"""SMS test fixtures: team acme with an approved sender ID ``Acme``."""

from __future__ import annotations

import httpx
import pytest

from tests.sms.helpers import SENDER, ok


@pytest.fixture
async def sms_client(client: httpx.AsyncClient) -> httpx.AsyncClient:
    """The acme client, with the sender ID ``Acme`` approved (the sandbox approves at once)."""
    created = ok(await client.post("/sender-ids", json={"value": SENDER,
                                                        "type": "alphanumeric"}), 201)
    assert created["status"] == "approved"
    return client
