"""POST /sms, GET /sms/{id}, PATCH, cancel, sync, preview; permissions and quotas."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import httpx
import pytest

from tests.conftest import MakeToken, assert_error
from tests.sms.helpers import NUMBER, later, ok, send, settled
from tidings.config import Config, QuotaDefaults

FIELDS = {
    "object", "id", "to", "from", "body", "last_event", "destination", "segments",
    "created_at", "updated_at", "message_id", "metadata", "scheduled_at", "failure",
    "submitted_at", "delivered_at",
}


@pytest.fixture
def config(database_url: str) -> Config:
    return Config(
        database_url=database_url, db_pool_size=4, rate_limit_per_second=0,
        shutdown_grace_seconds=2, sms_poll_seconds=0.2,
        quotas=QuotaDefaults(sms_per_day=5),
    )


async def test_send_answers_202_with_every_field(sms_client: httpx.AsyncClient) -> None:
    sms = await send(sms_client, to="+44 20 7946 0958", body="Grüße 😀",
                     metadata={"order": 42, "tags": ["a"]})
    assert set(sms) == FIELDS
    assert sms["to"] == "+442079460958"
    assert sms["destination"] == {"country": "GB"}
    assert (sms["from"], sms["body"], sms["last_event"], sms["segments"]) == (
        "Acme", "Grüße 😀", "queued", 1,
    )
    assert sms["metadata"] == {"order": 42, "tags": ["a"]}
    assert sms["failure"] is None and sms["message_id"] is None
    # A number no country has still has a string: 001, the world (UN M.49).
    freephone = await send(sms_client, to="+800 1234 5678")
    assert freephone["destination"] == {"country": "001"}
    assert ok(await sms_client.get(f"/sms/{freephone['id']}"))["destination"] == {
        "country": "001"}
    assert ok(await sms_client.get(f"/sms/{sms['id']}"))["id"] == sms["id"]


async def test_segments_follow_the_encoding(sms_client: httpx.AsyncClient) -> None:
    assert (await send(sms_client, body="a" * 161))["segments"] == 2
    assert (await send(sms_client, body="😀" * 36))["segments"] == 2


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"to": "12345", "from": "Acme", "body": "x"}, 400),
        ({"to": "+1415555", "from": "Acme", "body": "x"}, 400),
        ({"to": NUMBER, "from": "Acme", "body": ""}, 400),
        ({"to": NUMBER, "from": "Acme"}, 400),
        ({"to": NUMBER, "from": "Acme", "body": "x", "scheduled_at": "2020-01-01T00:00:00Z"},
         422),
        ({"to": NUMBER, "from": "Acme", "body": "x", "scheduled_at": "2999-01-01T00:00:00"}, 400),
        ({"to": NUMBER, "from": "Nobody", "body": "x"}, 422),
        ({"to": NUMBER, "from": "Acme", "body": "x", "extra": 1}, 400),
        # The search column's field separator: such a body could not be found.
        ({"to": NUMBER, "from": "Acme", "body": "z\u001fq"}, 400),
    ],
)
async def test_bad_sends(sms_client: httpx.AsyncClient, body: dict[str, Any], status: int) -> None:
    response = await sms_client.post("/sms", json=body)
    assert_error(response, status, "BAD_REQUEST" if status == 400 else "UNPROCESSABLE_ENTITY")


async def test_from_must_be_an_approved_sender_of_this_team(
    sms_client: httpx.AsyncClient, base_url: str, make_token: MakeToken
) -> None:
    other = await make_token(team="other")
    async with httpx.AsyncClient(base_url=base_url, headers=other.headers) as them:
        refused = await them.post("/sms", json={"to": NUMBER, "from": "Acme", "body": "x"})
        assert "from" in assert_error(refused, 422, "UNPROCESSABLE_ENTITY")


async def test_a_long_code_sender_matches_in_any_spelling(sms_client: httpx.AsyncClient) -> None:
    ok(await sms_client.post("/sender-ids", json={"value": "+14155550100",
                                                  "type": "long_code"}), 201)
    assert (await send(sms_client, **{"from": "14155550100"}))["from"] == "+14155550100"


async def test_reschedule_and_cancel_only_while_scheduled(sms_client: httpx.AsyncClient) -> None:
    sms = await send(sms_client, scheduled_at=later(hours=1))
    assert sms["scheduled_at"] is not None and sms["last_event"] == "queued"
    moved = ok(await sms_client.patch(f"/sms/{sms['id']}", json={"scheduled_at": later(hours=2)}))
    assert moved["scheduled_at"] > sms["scheduled_at"]
    past = await sms_client.patch(f"/sms/{sms['id']}",
                                  json={"scheduled_at": "2020-01-01T00:00:00Z"})
    assert_error(past, 422, "UNPROCESSABLE_ENTITY")
    canceled = ok(await sms_client.post(f"/sms/{sms['id']}/cancel"))
    assert canceled["last_event"] == "canceled"
    assert canceled["failure"] == {
        "code": "canceled", "message": "canceled by the team before it was sent"
    }
    assert_error(await sms_client.post(f"/sms/{sms['id']}/cancel"), 409, "CONFLICT")
    again = await sms_client.patch(f"/sms/{sms['id']}", json={"scheduled_at": later(hours=3)})
    assert_error(again, 409, "CONFLICT")
    now = await send(sms_client)
    assert_error(await sms_client.post(f"/sms/{now['id']}/cancel"), 409, "CONFLICT")
    missing = "00000000-0000-4000-8000-000000000000"
    assert_error(await sms_client.post(f"/sms/{missing}/cancel"), 404, "NOT_FOUND")
    assert_error(await sms_client.get("/sms/not-a-uuid"), 400, "BAD_REQUEST")


async def test_sync_asks_the_provider(sms_client: httpx.AsyncClient) -> None:
    sms = await send(sms_client)
    await settled(sms_client, sms["id"], "delivered")
    synced = ok(await sms_client.post(f"/sms/{sms['id']}/sync"))
    assert synced["last_event"] == "delivered"
    assert synced["message_id"].startswith("sandbox-")
    assert synced["submitted_at"] and synced["delivered_at"]


async def test_preview_says_why_a_message_costs_what_it_costs(
    sms_client: httpx.AsyncClient,
) -> None:
    body = {"to": NUMBER, "from": "Acme", "body": "“Hi” " + "a" * 70}
    preview = ok(await sms_client.post("/sms/preview", json=body))
    assert preview == {"encoding": "UCS-2", "segments": 2, "characters": 75, "units": 75,
                       "non_gsm_characters": ["“", "”"]}
    body["body"] = "Price: 5€"
    assert ok(await sms_client.post("/sms/preview", json=body))["units"] == 10
    assert ok(await sms_client.get("/sms")) == []  # nothing was sent


async def test_permissions(sms_client: httpx.AsyncClient, base_url: str,
                           make_token: MakeToken) -> None:
    sms = await send(sms_client)
    reader = await make_token(team="acme", permissions=["sms:read"])
    async with httpx.AsyncClient(base_url=base_url, headers=reader.headers) as client:
        ok(await client.get("/sms"))
        ok(await client.get(f"/sms/{sms['id']}"))
        for response in (
            await client.post("/sms", json={"to": NUMBER, "from": "Acme", "body": "x"}),
            await client.post(f"/sms/{sms['id']}/cancel"),
            await client.post(f"/sms/{sms['id']}/sync"),
            await client.patch(f"/sms/{sms['id']}", json={"scheduled_at": later(hours=1)}),
        ):
            assert "sms:send" in assert_error(response, 403, "FORBIDDEN")
    sender = await make_token(team="acme", permissions=["sms:send"])
    async with httpx.AsyncClient(base_url=base_url, headers=sender.headers) as client:
        await send(client)
        assert "sms:read" in assert_error(await client.get("/sms"), 403, "FORBIDDEN")
        assert_error(await client.get(f"/sms/{sms['id']}"), 403, "FORBIDDEN")


async def test_another_teams_message_is_404(
    sms_client: httpx.AsyncClient, base_url: str, make_token: MakeToken
) -> None:
    sms = await send(sms_client)
    other = await make_token(team="other")
    async with httpx.AsyncClient(base_url=base_url, headers=other.headers) as them:
        for response in (
            await them.get(f"/sms/{sms['id']}"),
            await them.post(f"/sms/{sms['id']}/cancel"),
            await them.post(f"/sms/{sms['id']}/sync"),
            await them.patch(f"/sms/{sms['id']}", json={"scheduled_at": later(hours=1)}),
        ):
            assert_error(response, 404, "NOT_FOUND")
        assert ok(await them.get("/sms")) == []


async def test_the_daily_quota_is_402_and_counts_nothing_refused(
    sms_client: httpx.AsyncClient,
) -> None:
    refused = await sms_client.post("/sms", json={"to": NUMBER, "from": "Nobody", "body": "x"})
    assert_error(refused, 422, "UNPROCESSABLE_ENTITY")
    for _ in range(5):
        await send(sms_client)
    over = await sms_client.post("/sms", json={"to": NUMBER, "from": "Acme", "body": "x"})
    assert_error(over, 402, "PAYMENT_REQUIRED")
    assert len(ok(await sms_client.get("/sms"))) == 5


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400", "1" + "0" * 400])
async def test_metadata_with_a_number_json_cannot_hold_is_400(
    sms_client: httpx.AsyncClient, number: str
) -> None:
    raw = f'{{"to": "{NUMBER}", "from": "Acme", "body": "x", "metadata": {{"a": [1, {number}]}}}}'
    response = await sms_client.post("/sms", content=raw,
                                     headers={"Content-Type": "application/json"})
    assert "metadata" in assert_error(response, 400, "BAD_REQUEST")


@pytest.mark.parametrize("moment", [
    "1700000000", "2026-11-23", "9999-12-31T23:59:59-12:00", "9999-12-31T23:59:59.999999Z",
    "0001-01-01T00:00:00Z",
])
async def test_scheduled_at_must_be_an_rfc_3339_date_time(
    sms_client: httpx.AsyncClient, moment: str
) -> None:
    response = await sms_client.post("/sms", json={
        "to": NUMBER, "from": "Acme", "body": "x", "scheduled_at": moment})
    assert "scheduled_at" in assert_error(response, 400, "BAD_REQUEST")


async def test_no_event_of_a_message_is_older_than_the_message(
    sms_client: httpx.AsyncClient,
) -> None:
    sent = [await send(sms_client) for _ in range(3)]
    sent.append(await send(sms_client, scheduled_at=later(hours=1)))
    listed = ok(await sms_client.get("/events", params={"limit": 100}))["data"]
    for sms in sent:
        created = datetime.fromisoformat(sms["created_at"])
        first = min(datetime.fromisoformat(e["occurred_at"])
                    for e in listed if e["message_id"] == sms["id"])
        assert created <= first, (sms["id"], created, first)
