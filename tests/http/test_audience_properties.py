"""Contact property definitions: create, list, get, change the fallback, delete."""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from tests.conftest import assert_error
from tests.http.audience import create, define, ok


async def test_define_list_get(client: httpx.AsyncClient) -> None:
    plan = await define(client, key="plan", type="string", fallback_value="free")
    assert plan["object"] == "contact_property"
    assert (plan["key"], plan["type"], plan["fallback_value"]) == ("plan", "string", "free")
    seats = await define(client, key="seats", type="number", fallback_value=1)
    vip = await define(client, key="vip", type="boolean", fallback_value=False)
    renews = await define(client, key="renews_on", type="date")
    assert renews["fallback_value"] is None

    listed = ok(await client.get("/contact-properties"))
    assert [p["key"] for p in listed["data"]] == ["renews_on", "vip", "seats", "plan"]
    paged = ok(await client.get("/contact-properties", params={"limit": 1, "offset": 3}))
    assert paged["data"] == [plan] and paged["has_more"] is False
    assert ok(await client.get(f"/contact-properties/{seats['id']}")) == seats
    assert vip["fallback_value"] is False
    assert_error(await client.get(f"/contact-properties/{uuid.uuid4()}"), 404, "NOT_FOUND")


async def test_keys_are_unique_per_team(client: httpx.AsyncClient) -> None:
    await define(client, key="plan", type="string")
    again = await client.post("/contact-properties", json={"key": "plan", "type": "number"})
    assert "key" in assert_error(again, 409, "CONFLICT")


async def test_definition_refusals(client: httpx.AsyncClient) -> None:
    refusals: list[tuple[dict[str, Any], str]] = [
        ({"type": "string"}, "key"),
        ({"key": "plan"}, "type"),
        ({"key": "plan", "type": "text"}, "type"),
        ({"key": "1plan", "type": "string"}, "key"),
        ({"key": "my plan", "type": "string"}, "key"),
        ({"key": "k" * 51, "type": "string"}, "key"),
        ({"key": "Email", "type": "string"}, "key"),
        ({"key": "plan", "type": "number", "fallback_value": "1"}, "fallback_value"),
        ({"key": "plan", "type": "boolean", "fallback_value": 0}, "fallback_value"),
        ({"key": "plan", "type": "date", "fallback_value": "tomorrow"}, "fallback_value"),
        ({"key": "plan", "type": "string", "fallback_value": ["a"]}, "fallback_value"),
        ({"key": "plan", "type": "string", "color": "red"}, "color"),
    ]
    for body, field in refusals:
        response = await client.post("/contact-properties", json=body)
        assert field in assert_error(response, 400, "BAD_REQUEST"), body
    assert ok(await client.get("/contact-properties"))["data"] == []


async def test_only_the_fallback_changes(client: httpx.AsyncClient) -> None:
    seats = await define(client, key="seats", type="number")
    path = f"/contact-properties/{seats['id']}"
    changed = ok(await client.patch(path, json={"fallback_value": 5}))
    assert changed["fallback_value"] == 5 and changed["updated_at"] > seats["updated_at"]
    assert ok(await client.patch(path, json={"fallback_value": None}))["fallback_value"] is None
    wrong = await client.patch(path, json={"fallback_value": "five"})
    assert "fallback_value" in assert_error(wrong, 400, "BAD_REQUEST")
    for body, field in [({"type": "string"}, "type"), ({"key": "x"}, "key"), ({}, "fallback")]:
        message = assert_error(await client.patch(path, json=body), 400, "BAD_REQUEST")
        assert field in message
    missing = await client.patch(f"/contact-properties/{uuid.uuid4()}", json={"fallback_value": 1})
    assert_error(missing, 404, "NOT_FOUND")


async def test_deleting_a_definition_removes_its_values(client: httpx.AsyncClient) -> None:
    plan = await define(client, key="plan", type="string")
    await define(client, key="seats", type="number")
    with_both = await create(client, email="a@example.com", properties={"plan": "pro", "seats": 2})
    with_plan = await create(client, email="b@example.com", properties={"plan": "free"})
    without = await create(client, email="c@example.com")

    ok(await client.delete(f"/contact-properties/{plan['id']}"), 204)
    assert_error(await client.get(f"/contact-properties/{plan['id']}"), 404, "NOT_FOUND")
    assert_error(await client.delete(f"/contact-properties/{plan['id']}"), 404, "NOT_FOUND")
    assert ok(await client.get(f"/contacts/{with_both['id']}"))["properties"] == {"seats": 2}
    assert ok(await client.get(f"/contacts/{with_plan['id']}"))["properties"] == {}
    assert ok(await client.get(f"/contacts/{without['id']}")) == without
    # The key is unknown now, and can be defined again with another type.
    refused = await client.post(
        "/contacts", json={"email": "d@example.com", "properties": {"plan": "x"}}
    )
    assert_error(refused, 422, "UNPROCESSABLE_ENTITY")
    await define(client, key="plan", type="boolean")
