"""POST/GET/DELETE /sender-ids: validation, approval, isolation, permissions."""

from __future__ import annotations

from uuid import UUID

import httpx
import pytest

from tests.conftest import Credential, MakeToken, assert_error
from tests.sms.helpers import ok
from tidings.service import Service
from tidings.storage import sender_ids as sender_id_store


async def test_create_each_type_is_approved_at_once_in_the_sandbox(
    client: httpx.AsyncClient,
) -> None:
    alpha = ok(await client.post("/sender-ids", json={"value": "Acme 2", "type": "alphanumeric",
                                                      "countries": ["GB", "DE"]}), 201)
    assert alpha["object"] == "sender_id"
    assert (alpha["value"], alpha["type"], alpha["status"], alpha["countries"]) == (
        "Acme 2", "alphanumeric", "approved", ["GB", "DE"],
    )
    long = ok(await client.post("/sender-ids", json={"value": "14155550100",
                                                     "type": "long_code"}), 201)
    assert (long["value"], long["countries"]) == ("+14155550100", ["US"])
    short = ok(await client.post("/sender-ids", json={"value": "12345", "type": "short_code"}), 201)
    assert short["value"] == "12345"
    assert set(alpha) == {"object", "id", "value", "type", "status", "countries",
                          "created_at", "updated_at"}


@pytest.mark.parametrize(
    ("value", "type"),
    [
        ("", "alphanumeric"), ("TwelveChars1", "alphanumeric"), ("12345", "alphanumeric"),
        ("Acme!", "alphanumeric"), ("Acmé", "alphanumeric"), ("12", "short_code"),
        ("123456789", "short_code"), ("12a45", "short_code"), ("+1415abc", "long_code"),
        ("+999123", "long_code"), ("Acme", "toll_free"),
    ],
)
async def test_invalid_values_are_400(client: httpx.AsyncClient, value: str, type: str) -> None:
    response = await client.post("/sender-ids", json={"value": value, "type": type})
    assert_error(response, 400, "BAD_REQUEST")


async def test_eleven_characters_with_a_space_and_one_letter_are_enough(
    client: httpx.AsyncClient,
) -> None:
    ok(await client.post("/sender-ids", json={"value": "A1234 67890", "type": "alphanumeric"}), 201)


async def test_a_duplicate_value_is_409(client: httpx.AsyncClient) -> None:
    ok(await client.post("/sender-ids", json={"value": "Acme", "type": "alphanumeric"}), 201)
    again = await client.post("/sender-ids", json={"value": "Acme", "type": "alphanumeric"})
    assert "value" in assert_error(again, 409, "CONFLICT")


async def test_list_get_delete_and_other_teams(
    client: httpx.AsyncClient, base_url: str, make_token: MakeToken
) -> None:
    first = ok(await client.post("/sender-ids", json={"value": "One", "type": "alphanumeric"}), 201)
    second = ok(await client.post("/sender-ids", json={"value": "Two", "type": "alphanumeric"}),
                201)
    listed = ok(await client.get("/sender-ids", params={"limit": 1}))
    assert [s["id"] for s in listed["data"]] == [second["id"]] and listed["has_more"]
    assert ok(await client.get(f"/sender-ids/{first['id']}"))["value"] == "One"
    other: Credential = await make_token(team="other")
    async with httpx.AsyncClient(base_url=base_url, headers=other.headers) as them:
        assert_error(await them.get(f"/sender-ids/{first['id']}"), 404, "NOT_FOUND")
        assert_error(await them.delete(f"/sender-ids/{first['id']}"), 404, "NOT_FOUND")
        assert ok(await them.get("/sender-ids"))["data"] == []
    deleted = await client.delete(f"/sender-ids/{first['id']}")
    assert deleted.status_code == 204
    assert_error(await client.get(f"/sender-ids/{first['id']}"), 404, "NOT_FOUND")


async def test_permissions_are_domains_read_and_write(
    base_url: str, make_token: MakeToken
) -> None:
    reader = await make_token(team="acme", permissions=["domains:read"])
    async with httpx.AsyncClient(base_url=base_url, headers=reader.headers) as client:
        ok(await client.get("/sender-ids"))
        refused = await client.post("/sender-ids", json={"value": "Acme", "type": "alphanumeric"})
        assert "domains:write" in assert_error(refused, 403, "FORBIDDEN")
    sender = await make_token(team="acme", permissions=["sms:send"])
    async with httpx.AsyncClient(base_url=base_url, headers=sender.headers) as client:
        assert_error(await client.get("/sender-ids"), 403, "FORBIDDEN")


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"value": "Acme", "type": "alphanumeric", "countries": ["XX"]}, "countries.0"),
        ({"value": "Acme", "type": "alphanumeric", "countries": ["GB", "UK"]}, "countries.1"),
        ({"value": "Acme", "type": "alphanumeric", "countries": ["EU"]}, "countries.0"),
        ({"value": "Acme", "type": "alphanumeric", "countries": ["us"]}, "countries.0"),
        # A UK number that no plan lists as assigned is still a UK number.
        ({"value": "+447700900123", "type": "long_code", "countries": ["US"]}, "GB"),
        ({"value": "+14155550100", "type": "long_code", "countries": ["CA"]}, "US"),
    ],
)
async def test_countries_are_real_and_a_long_codes_own(
    client: httpx.AsyncClient, body: dict[str, object], reason: str
) -> None:
    response = await client.post("/sender-ids", json=body)
    assert reason in assert_error(response, 400, "BAD_REQUEST")


async def test_an_unlisted_number_keeps_a_country_of_its_calling_code(
    client: httpx.AsyncClient,
) -> None:
    found = ok(await client.post("/sender-ids", json={"value": "+447700900123",
                                                      "type": "long_code"}), 201)
    assert found["countries"] == ["GB"]
    jersey = ok(await client.post("/sender-ids", json={
        "value": "+447700900124", "type": "long_code", "countries": ["JE"]}), 201)
    assert jersey["countries"] == ["JE"]


async def test_a_number_belongs_to_one_team(
    client: httpx.AsyncClient, base_url: str, make_token: MakeToken
) -> None:
    """Another team cannot register a long or short code a team has (it would
    send as that team and take its replies); an alphanumeric name can be shared."""
    mine = ok(await client.post("/sender-ids", json={"value": "+14155550100",
                                                     "type": "long_code"}), 201)
    ok(await client.post("/sender-ids", json={"value": "55555", "type": "short_code"}), 201)
    ok(await client.post("/sender-ids", json={"value": "Acme", "type": "alphanumeric"}), 201)
    other: Credential = await make_token(team="other")
    async with httpx.AsyncClient(base_url=base_url, headers=other.headers) as them:
        for body in ({"value": "14155550100", "type": "long_code"},
                     {"value": "55555", "type": "short_code"}):
            taken = await them.post("/sender-ids", json=body)
            assert "another team" in assert_error(taken, 409, "CONFLICT")
        ok(await them.post("/sender-ids", json={"value": "Acme", "type": "alphanumeric"}), 201)
        refused = await them.post("/sms", json={"to": "+14155552000", "from": "+14155550100",
                                                "body": "x"})
        assert_error(refused, 422, "UNPROCESSABLE_ENTITY")
        assert (await client.delete(f"/sender-ids/{mine['id']}")).status_code == 204
        ok(await them.post("/sender-ids", json={"value": "+14155550100", "type": "long_code"}),
           201)


async def test_a_number_under_review_is_its_teams_for_replies(
    client: httpx.AsyncClient, service: Service
) -> None:
    """A STOP that reaches the team's long code while Twilio still reviews it
    is the team's: the number belongs to that team alone already. A rejected
    one is no one's, and an alphanumeric name never is."""
    created = ok(await client.post("/sender-ids", json={"value": "+14155550188",
                                                        "type": "long_code"}), 201)
    async with service.db.acquire() as conn:
        team_id = await conn.fetchval(
            "SELECT team_id FROM sender_ids WHERE id = $1", UUID(created["id"]))
        for status, owners in (("pending", [team_id]), ("approved", [team_id]),
                               ("rejected", [])):
            await conn.execute("UPDATE sender_ids SET status = $2 WHERE id = $1",
                               UUID(created["id"]), status)
            found = await service.db.run(sender_id_store.teams_of_sender, ["+14155550188"])
            assert found == owners, status
