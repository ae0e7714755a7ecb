"""Suppressions: normalised, unique per team, and one question for many addresses."""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from tests.conftest import MakeToken, assert_error
from tests.http.audience import make, ok
from tidings.service import Service
from tidings.storage import suppressions as suppression_store


async def suppress(client: httpx.AsyncClient, address: str, **more: Any) -> dict[str, Any]:
    return await make(client, "/suppressions", address=address, **more)


async def test_addresses_are_normalised_and_unique(client: httpx.AsyncClient) -> None:
    message_id = str(uuid.uuid4())
    email = await suppress(client, " Ada@Example.COM ", reason="bounce",
                           source_message_id=message_id)
    assert email["object"] == "suppression"
    assert (email["address"], email["kind"], email["reason"], email["source_message_id"]) == (
        "ada@example.com", "email", "bounce", message_id
    )
    phone = await suppress(client, "+44 20 7946 0958", reason="sms_opt_out")
    assert (phone["address"], phone["kind"], phone["source_message_id"]) == (
        "+442079460958", "phone", None
    )
    assert (await suppress(client, "bob@example.com"))["reason"] == "manual"

    for again in ("ADA@example.com", "+442079460958", "+44 (0)20 7946 0958"):
        response = await client.post("/suppressions", json={"address": again})
        assert "address" in assert_error(response, 409, "CONFLICT"), again
    assert ok(await client.get(f"/suppressions/{email['id']}")) == email


async def test_suppression_refusals(client: httpx.AsyncClient) -> None:
    refusals: list[tuple[dict[str, Any], str]] = [
        ({}, "address"),
        ({"address": ""}, "address"),
        ({"address": "ada@"}, "address"),
        ({"address": "ada@localhost"}, "address"),
        ({"address": "020 7946 0958"}, "address"),
        ({"address": "+1 555"}, "address"),
        ({"address": "a@example.com", "reason": "spam"}, "reason"),
        ({"address": "a@example.com", "source_message_id": "msg-1"}, "source_message_id"),
        ({"address": "a@example.com", "note": "x"}, "note"),
        # A phone cannot bounce or complain; only a phone replies STOP.
        ({"address": "a@example.com", "reason": "sms_opt_out"}, "reason"),
        ({"address": "+14155550100", "reason": "bounce"}, "reason"),
        ({"address": "+14155550100", "reason": "complaint"}, "reason"),
    ]
    for body, field in refusals:
        message = assert_error(await client.post("/suppressions", json=body), 400, "BAD_REQUEST")
        assert field in message, body
    assert ok(await client.get("/suppressions"))["data"] == []


async def test_list_filter_get_delete(client: httpx.AsyncClient) -> None:
    bounce = await suppress(client, "bounce@example.com", reason="bounce")
    complaint = await suppress(client, "angry@example.org", reason="complaint")
    phone = await suppress(client, "+14155550100", reason="sms_opt_out")

    def addresses(listed: dict[str, Any]) -> list[str]:
        return [s["address"] for s in listed["data"]]

    everything = ok(await client.get("/suppressions"))
    assert addresses(everything) == [phone["address"], complaint["address"], bounce["address"]]
    assert addresses(ok(await client.get("/suppressions", params={"reason": "complaint"}))) == [
        "angry@example.org"
    ]
    assert addresses(ok(await client.get("/suppressions", params={"search": "EXAMPLE.O"}))) == [
        "angry@example.org"
    ]
    assert addresses(ok(await client.get("/suppressions", params={"search": "4155"}))) == [
        "+14155550100"
    ]
    assert ok(await client.get("/suppressions", params={"search": "%"}))["data"] == []
    paged = ok(await client.get("/suppressions", params={"limit": 1, "offset": 1}))
    assert addresses(paged) == ["angry@example.org"] and paged["has_more"] is True
    for params in ({"reason": "spam"}, {"search": ""}, {"limit": 0}):
        assert_error(await client.get("/suppressions", params=params), 400, "BAD_REQUEST")

    ok(await client.delete(f"/suppressions/{complaint['id']}"), 204)
    assert_error(await client.get(f"/suppressions/{complaint['id']}"), 404, "NOT_FOUND")
    assert_error(await client.delete(f"/suppressions/{complaint['id']}"), 404, "NOT_FOUND")
    # Lifted, the address can be suppressed again.
    await suppress(client, "angry@example.org")


async def test_suppressed_answers_for_many_addresses_at_once(
    client: httpx.AsyncClient, http: httpx.AsyncClient, service: Service, make_token: MakeToken
) -> None:
    first = await suppress(client, "Ada@Example.com", reason="complaint")
    await suppress(client, "+14155550100", reason="sms_opt_out")
    globex = await make_token(team="globex")
    ok(await http.post("/suppressions", json={"address": "grace@example.com"},
                       headers=globex.headers), 201)
    team_id = uuid.UUID(first["team_id"])
    asked = [
        "ada@example.com", "ADA@EXAMPLE.COM", "+14155550100", "grace@example.com",
        "+14155550101", "nobody@example.com",
    ]
    await suppress(client, "İz@example.com")
    dotted = await client.post("/suppressions", json={"address": "iz@example.com"})
    assert_error(dotted, 409, "CONFLICT")  # the same mailbox, as PostgreSQL folds it
    asked.append("İZ@example.com")
    async with service.db.acquire() as conn:
        found = await suppression_store.suppressed(conn, team_id, asked)
        assert found == {"ada@example.com", "ADA@EXAMPLE.COM", "+14155550100", "İZ@example.com"}
        assert await suppression_store.suppressed(conn, team_id, []) == set()
        many = [f"user{n}@example.com" for n in range(5000)] + ["ada@example.com"]
        assert await suppression_store.suppressed(conn, team_id, iter(many)) == {"ada@example.com"}
        assert await suppression_store.suppressed(conn, globex.team_id, asked) == {
            "grace@example.com"
        }
