"""Event lists with repeats, enabling an enabled endpoint, and the events filter."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import assert_error
from tests.webhooks.conftest import Emit, create_endpoint
from tidings.service import Service
from tidings.webhooks.catalogue import EVENT_TYPES

PUBLIC_URL = "https://93.184.215.14/hooks"


async def test_repeats_do_not_count_against_the_limit(client: httpx.AsyncClient) -> None:
    endpoint = await create_endpoint(client, PUBLIC_URL, ["message.sent"] * 50)
    assert endpoint["events"] == ["message.sent"]
    every = [*EVENT_TYPES, "*"]
    endpoint = await create_endpoint(client, PUBLIC_URL, every + every[::-1])
    assert endpoint["events"] == every
    path = f"/webhook-endpoints/{endpoint['id']}"
    response = await client.patch(path, json={"events": ["message.failed"] * 21})
    assert response.status_code == 200, response.text
    assert response.json()["data"]["events"] == ["message.failed"]
    assert_error(await client.patch(path, json={"events": []}), 400, "BAD_REQUEST")


async def test_enabling_an_enabled_endpoint_leaves_it_as_it_is(
    client: httpx.AsyncClient, service: Service
) -> None:
    endpoint = await create_endpoint(client, PUBLIC_URL)
    path = f"/webhook-endpoints/{endpoint['id']}"
    async with service.db.acquire() as conn:
        await conn.execute(
            "UPDATE webhook_endpoints SET consecutive_failures = 19,"
            " last_failure_at = now() WHERE id = $1",
            endpoint["id"],
        )
    before = (await client.get(path)).json()["data"]
    response = await client.post(f"{path}/enable")
    assert response.status_code == 200, response.text
    assert response.json()["data"] == before
    assert before["consecutive_failures"] == 19 and before["status"] == "enabled"

    # A disabled endpoint starts over when it is enabled.
    await client.post(f"{path}/disable")
    enabled = (await client.post(f"{path}/enable")).json()["data"]
    assert enabled["status"] == "enabled"
    assert enabled["consecutive_failures"] == 0
    assert enabled["disabled_reason"] is None and enabled["disabled_at"] is None


@pytest.mark.parametrize(
    "bogus", ["message.bogus", "message.*", "message", "*", "MESSAGE.SENT", "message.sent "]
)
async def test_an_unknown_event_type_filter_is_400(
    client: httpx.AsyncClient, emit: Emit, bogus: str
) -> None:
    await emit("message.sent")
    message = assert_error(await client.get("/events", params={"type": bogus}), 400, "BAD_REQUEST")
    assert "type" in message


async def test_every_type_of_the_catalogue_filters(client: httpx.AsyncClient, emit: Emit) -> None:
    sent = await emit("message.sent")
    for name in EVENT_TYPES:
        response = await client.get("/events", params={"type": name})
        assert response.status_code == 200, response.text
        ids = [event["id"] for event in response.json()["data"]["data"]]
        assert ids == ([str(sent)] if name == "message.sent" else [])
