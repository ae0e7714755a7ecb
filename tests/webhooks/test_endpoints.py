"""Endpoint routes, their validation, the SSRF guard, events and team isolation."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.conftest import Credential, MakeToken, assert_error
from tests.webhooks.conftest import Emit, MakeReceiver, create_endpoint, custom_service
from tidings.service import Service
from tidings.storage.events import record_event
from tidings.webhooks.catalogue import EVENT_TYPES

PUBLIC_URL = "https://93.184.215.14/hooks"  # an address literal: no DNS needed
MISSING = "00000000-0000-4000-8000-000000000000"


async def test_create_returns_the_endpoint_with_its_secret(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/webhook-endpoints",
        json={"url": PUBLIC_URL, "events": ["message.delivered"], "description": "orders"},
    )
    assert response.status_code == 201, response.text
    endpoint = response.json()["data"]
    assert set(endpoint) == {
        "object", "id", "url", "events", "description", "status", "consecutive_failures",
        "last_failure_at", "disabled_reason", "disabled_at", "created_at", "updated_at",
        "secret",
    }
    assert endpoint["object"] == "webhook_endpoint"
    assert endpoint["secret"].startswith("whsec_") and len(endpoint["secret"]) >= 40
    assert endpoint["url"] == PUBLIC_URL
    assert endpoint["events"] == ["message.delivered"]
    assert endpoint["status"] == "enabled"
    assert endpoint["consecutive_failures"] == 0
    assert endpoint["last_failure_at"] is None
    assert endpoint["disabled_reason"] is None and endpoint["disabled_at"] is None

    fetched = (await client.get(f"/webhook-endpoints/{endpoint['id']}")).json()["data"]
    assert "secret" not in fetched
    assert fetched == {k: v for k, v in endpoint.items() if k != "secret"}


async def test_list_is_paged_newest_first(client: httpx.AsyncClient) -> None:
    ids = [(await create_endpoint(client, f"{PUBLIC_URL}/{n}"))["id"] for n in range(3)]
    first = (await client.get("/webhook-endpoints", params={"limit": 2})).json()["data"]
    assert [e["id"] for e in first["data"]] == ids[::-1][:2]
    assert first["has_more"] is True
    assert all("secret" not in e for e in first["data"])
    rest = (await client.get("/webhook-endpoints", params={"limit": 2, "offset": 2})).json()
    assert [e["id"] for e in rest["data"]["data"]] == ids[:1]
    assert rest["data"]["has_more"] is False


async def test_update_changes_only_what_is_given(client: httpx.AsyncClient) -> None:
    endpoint = await create_endpoint(client, PUBLIC_URL, ["message.sent"])
    path = f"/webhook-endpoints/{endpoint['id']}"
    response = await client.patch(path, json={"description": "billing"})
    assert response.status_code == 200, response.text
    updated = response.json()["data"]
    assert (updated["url"], updated["events"], updated["description"]) == (
        PUBLIC_URL, ["message.sent"], "billing",
    )
    updated = (await client.patch(
        path, json={"url": PUBLIC_URL + "/v2", "events": ["*"]}
    )).json()["data"]
    assert (updated["url"], updated["events"], updated["description"]) == (
        PUBLIC_URL + "/v2", ["*"], "billing",
    )
    updated = (await client.patch(path, json={"description": None})).json()["data"]
    assert updated["description"] is None
    assert updated["updated_at"] >= endpoint["updated_at"]
    assert_error(await client.patch(path, json={"url": None}), 400, "BAD_REQUEST")
    assert_error(await client.patch(path, json={"secret": "whsec_mine"}), 400, "BAD_REQUEST")
    # Nothing to change is refused, as by every PATCH, and changes nothing.
    before = (await client.get(path)).json()["data"]
    message = assert_error(await client.patch(path, json={}), 400, "BAD_REQUEST")
    assert "at least one field" in message
    assert (await client.get(path)).json()["data"] == before


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"events": ["*"]}, "url"),
        ({"url": PUBLIC_URL}, "events"),
        ({"url": "ftp://example.com/hook", "events": ["*"]}, "url"),
        ({"url": "/relative/hook", "events": ["*"]}, "url"),
        ({"url": "example.com/hook", "events": ["*"]}, "url"),
        ({"url": "https:///no-host", "events": ["*"]}, "url"),
        ({"url": "https://user:pw@example.com/", "events": ["*"]}, "url"),
        ({"url": "https://example.com:99999/", "events": ["*"]}, "url"),
        ({"url": "https://exa mple.com/", "events": ["*"]}, "url"),
        ({"url": "https://example.com/" + "a" * 2029, "events": ["*"]}, "url"),
        ({"url": 42, "events": ["*"]}, "url"),
        ({"url": "https://exämple.com/hook", "events": ["*"]}, "url"),
        ({"url": "https://example.com/ä", "events": ["*"]}, "url"),
        ({"url": "https://" + "a" * 64 + ".example.com/", "events": ["*"]}, "url"),
        ({"url": "https://a..example.com/", "events": ["*"]}, "url"),
        ({"url": PUBLIC_URL, "events": []}, "events"),
        ({"url": PUBLIC_URL, "events": ["message.teleported"]}, "events"),
        ({"url": PUBLIC_URL, "events": "*"}, "events"),
        ({"url": PUBLIC_URL, "events": ["*"], "description": "d" * 501}, "description"),
        ({"url": PUBLIC_URL, "events": ["*"], "status": "disabled"}, "status"),
    ],
)
async def test_invalid_endpoints_are_400_naming_the_field(
    client: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    message = assert_error(await client.post("/webhook-endpoints", json=body), 400, "BAD_REQUEST")
    assert field in message


async def test_a_url_of_2048_characters_is_accepted(client: httpx.AsyncClient) -> None:
    url = "https://example.com/" + "a" * (2048 - len("https://example.com/"))
    assert len(url) == 2048
    endpoint = await create_endpoint(client, url)
    assert endpoint["url"] == url


async def test_repeated_event_types_are_kept_once(client: httpx.AsyncClient) -> None:
    endpoint = await create_endpoint(
        client, PUBLIC_URL, ["message.sent", "message.failed", "message.sent"]
    )
    assert endpoint["events"] == ["message.sent", "message.failed"]


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/hook",
        "http://localhost:8080/hook",
        "https://10.1.2.3/hook",
        "https://172.16.0.1/hook",
        "https://192.168.1.10/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]/hook",
        "http://[fe80::1]/hook",
        "http://[::ffff:127.0.0.1]/hook",
        "http://0.0.0.0/hook",
        "http://224.0.0.1/hook",
        "http://100.64.0.1/hook",
        "http://192.0.0.8/hook",
        "http://[::7f00:1]/hook",
        "http://[::ffff:0:7f00:1]/hook",
        "http://[64:ff9b::a9fe:a9fe]/latest/meta-data",
        "http://[2002:a9fe:a9fe::1]/hook",
        "http://[fec0::1]/hook",
        "http://[fd00::1]/hook",
    ],
)
@pytest.mark.settings(webhook_allow_private_urls=False)
async def test_private_targets_are_refused_with_422(client: httpx.AsyncClient, url: str) -> None:
    message = assert_error(
        await client.post("/webhook-endpoints", json={"url": url, "events": ["*"]}),
        422,
        "UNPROCESSABLE_ENTITY",
    )
    assert message.startswith("url: ")
    endpoint = await create_endpoint(client, PUBLIC_URL)
    assert_error(
        await client.patch(f"/webhook-endpoints/{endpoint['id']}", json={"url": url}),
        422,
        "UNPROCESSABLE_ENTITY",
    )


async def test_a_name_resolving_to_a_private_address_is_refused(database_url: str) -> None:
    async def resolve(host: str, port: int) -> list[str]:
        return {"hooks.example.com": ["93.184.215.14", "10.0.0.5"]}.get(host, ["93.184.215.14"])

    async with custom_service(
        database_url, resolve=resolve, webhook_allow_private_urls=False
    ) as custom:
        client = custom.client
        message = assert_error(
            await client.post(
                "/webhook-endpoints", json={"url": "https://hooks.example.com/", "events": ["*"]}
            ),
            422,
            "UNPROCESSABLE_ENTITY",
        )
        assert "10.0.0.5" in message and "private" in message
        await create_endpoint(client, "https://public.example.com/")


async def test_a_name_rebound_to_loopback_is_refused_at_delivery(
    database_url: str, make_receiver: MakeReceiver
) -> None:
    receiver = await make_receiver()
    port = receiver.url.split(":")[2].split("/")[0]
    answers = iter([["93.184.215.14"]])

    async def rebinding(host: str, port: int) -> list[str]:
        # Public when the endpoint is created, loopback ever after.
        return next(answers, ["127.0.0.1"])

    async with custom_service(
        database_url, resolve=rebinding, webhook_allow_private_urls=False,
        webhook_retry_schedule=(0,),
    ) as custom:
        client = custom.client
        endpoint = await create_endpoint(client, f"http://rebind.example.com:{port}/hook")
        await custom.emit()

        async def attempted() -> list[dict[str, Any]]:
            listed = await client.get(f"/webhook-endpoints/{endpoint['id']}/deliveries")
            return [d for d in listed.json()["data"]["data"] if d["status"] == "failed"]

        with trio.fail_after(10):
            while not (failed := await attempted()):
                await trio.sleep(0.05)
        assert "127.0.0.1" in failed[0]["error"] and "loopback" in failed[0]["error"]
        assert receiver.requests == []


async def test_disable_and_enable(client: httpx.AsyncClient) -> None:
    endpoint = await create_endpoint(client, PUBLIC_URL)
    path = f"/webhook-endpoints/{endpoint['id']}"
    disabled = (await client.post(f"{path}/disable")).json()["data"]
    assert disabled["status"] == "disabled"
    assert disabled["disabled_reason"] == "manual"
    assert disabled["disabled_at"] is not None
    again = (await client.post(f"{path}/disable")).json()["data"]
    assert again["disabled_at"] == disabled["disabled_at"]  # already disabled: unchanged
    enabled = (await client.post(f"{path}/enable")).json()["data"]
    assert enabled["status"] == "enabled"
    assert enabled["disabled_reason"] is None and enabled["disabled_at"] is None


async def test_a_disabled_endpoint_gets_no_test_event(client: httpx.AsyncClient) -> None:
    endpoint = await create_endpoint(client, PUBLIC_URL)
    await client.post(f"/webhook-endpoints/{endpoint['id']}/disable")
    assert_error(
        await client.post(f"/webhook-endpoints/{endpoint['id']}/test"), 409, "CONFLICT"
    )


async def test_delivery_list_filters_by_status(
    client: httpx.AsyncClient, make_receiver: MakeReceiver, emit: Emit
) -> None:
    receiver = await make_receiver()
    endpoint = await create_endpoint(client, receiver.url)
    await emit()
    await receiver.wait_for(1)
    path = f"/webhook-endpoints/{endpoint['id']}/deliveries"
    with trio.fail_after(5):
        while not (await client.get(path, params={"status": "succeeded"})).json()["data"]["data"]:
            await trio.sleep(0.05)
    assert (await client.get(path, params={"status": "failed"})).json()["data"]["data"] == []
    assert_error(await client.get(path, params={"status": "lost"}), 400, "BAD_REQUEST")


async def test_a_nul_in_a_filter_is_400(client: httpx.AsyncClient) -> None:
    message = assert_error(await client.get("/events?type=%00"), 400, "BAD_REQUEST")
    assert "type" in message


async def test_event_types_are_the_catalogue(client: httpx.AsyncClient) -> None:
    listed = (await client.get("/event-types")).json()["data"]
    names = [item["name"] for item in listed["data"]]
    assert names == list(EVENT_TYPES)
    for required in (
        "message.queued", "message.sent", "message.delivered", "message.delivery_delayed",
        "message.bounced", "message.complained", "message.failed", "message.undelivered",
        "message.canceled", "broadcast.sent", "broadcast.failed", "webhook.test",
    ):
        assert required in names
    assert all(item["description"] for item in listed["data"])
    # The guide lists them all, and says how many an endpoint may name.
    guide = (Path(__file__).parents[2] / "docs" / "webhooks.md").read_text()
    section = guide[guide.index("### Event types"):guide.index("## The request your receiver")]
    assert sorted(set(re.findall(r"`([a-z_]+\.[a-z_]+)`", section))) == sorted(EVENT_TYPES)
    assert f"{len(EVENT_TYPES)} in all" in section
    assert f'plus `"*"` ({len(EVENT_TYPES) + 1} today)' in guide


async def test_event_types_are_paged_like_every_list(client: httpx.AsyncClient) -> None:
    first = (await client.get("/event-types?limit=5")).json()["data"]
    assert [item["name"] for item in first["data"]] == list(EVENT_TYPES)[:5]
    assert first["has_more"] is True
    rest = (await client.get("/event-types?limit=100&offset=5")).json()["data"]
    assert [item["name"] for item in rest["data"]] == list(EVENT_TYPES)[5:]
    assert rest["has_more"] is False
    for bad, field in (("limit=0", "limit"), ("limit=2.5", "limit"), ("offset=-5", "offset"),
                       ("bogus=1", "bogus")):
        message = assert_error(await client.get(f"/event-types?{bad}"), 400, "BAD_REQUEST")
        assert field in message


async def test_events_are_listed_filtered_and_fetched(
    client: httpx.AsyncClient, emit: Emit
) -> None:
    message_id = "8f14e45f-ceea-467f-a0e6-4c5f0b6c7f10"
    first = await emit("message.sent", message_id=message_id)
    second = await emit("message.delivered", message_id=message_id, data={"smtp": "250 ok"})
    third = await emit("message.delivered")
    listed = (await client.get("/events")).json()["data"]
    assert [e["id"] for e in listed["data"]] == [str(third), str(second), str(first)]
    by_type = (await client.get("/events", params={"type": "message.delivered"})).json()
    assert [e["id"] for e in by_type["data"]["data"]] == [str(third), str(second)]
    by_message = (await client.get("/events", params={"message_id": message_id})).json()
    assert [e["id"] for e in by_message["data"]["data"]] == [str(second), str(first)]
    event = (await client.get(f"/events/{second}")).json()["data"]
    assert event == {
        "object": "event",
        "id": str(second),
        "type": "message.delivered",
        "channel": "email",
        "message_id": message_id,
        "to": "ada@example.com",
        "occurred_at": event["occurred_at"],
        "data": {"smtp": "250 ok"},
        "created_at": event["created_at"],
    }


async def test_an_event_rolled_back_with_its_change_leaves_nothing(
    client: httpx.AsyncClient, make_receiver: MakeReceiver, service: Service, acme: Credential
) -> None:
    receiver = await make_receiver()
    endpoint = await create_endpoint(client, receiver.url)

    class Abandoned(Exception):
        pass

    with pytest.raises(Abandoned):
        async with service.db.transaction() as conn:
            await record_event(conn, acme.team_id, "message.sent")
            raise Abandoned
    await trio.sleep(0.5)
    assert (await client.get("/events")).json()["data"]["data"] == []
    listed = await client.get(f"/webhook-endpoints/{endpoint['id']}/deliveries")
    assert listed.json()["data"]["data"] == []
    assert receiver.requests == []


async def test_read_permission_cannot_change_endpoints(
    client: httpx.AsyncClient, http: httpx.AsyncClient, make_token: MakeToken
) -> None:
    reader = await make_token(permissions=["webhooks:read"])
    endpoint = await create_endpoint(client, PUBLIC_URL)
    assert (await http.get("/webhook-endpoints", headers=reader.headers)).status_code == 200
    for method, path in [
        ("POST", "/webhook-endpoints"),
        ("PATCH", f"/webhook-endpoints/{endpoint['id']}"),
        ("DELETE", f"/webhook-endpoints/{endpoint['id']}"),
        ("POST", f"/webhook-endpoints/{endpoint['id']}/disable"),
        ("POST", f"/webhook-endpoints/{endpoint['id']}/rotate-secret"),
    ]:
        response = await http.request(method, path, json={}, headers=reader.headers)
        assert_error(response, 403, "FORBIDDEN")


async def test_another_teams_ids_are_404_on_every_route(
    client: httpx.AsyncClient,
    http: httpx.AsyncClient,
    make_token: MakeToken,
    make_receiver: MakeReceiver,
    emit: Emit,
) -> None:
    receiver = await make_receiver()
    endpoint = await create_endpoint(client, receiver.url)
    event_id = await emit()
    [request] = await receiver.wait_for(1)
    delivery_id = request.headers["x-service-delivery"]
    intruder = (await make_token(team="globex")).headers
    for method, path, body in [
        ("GET", f"/webhook-endpoints/{endpoint['id']}", None),
        ("PATCH", f"/webhook-endpoints/{endpoint['id']}", {"description": "mine"}),
        ("DELETE", f"/webhook-endpoints/{endpoint['id']}", None),
        ("POST", f"/webhook-endpoints/{endpoint['id']}/disable", None),
        ("POST", f"/webhook-endpoints/{endpoint['id']}/enable", None),
        ("POST", f"/webhook-endpoints/{endpoint['id']}/rotate-secret", None),
        ("POST", f"/webhook-endpoints/{endpoint['id']}/test", None),
        ("GET", f"/webhook-endpoints/{endpoint['id']}/deliveries", None),
        ("GET", f"/webhook-deliveries/{delivery_id}", None),
        ("POST", f"/webhook-deliveries/{delivery_id}/retry", None),
        ("GET", f"/events/{event_id}", None),
        ("GET", f"/webhook-endpoints/{MISSING}", None),
        ("GET", f"/webhook-deliveries/{MISSING}", None),
        ("GET", f"/events/{MISSING}", None),
    ]:
        response = await http.request(method, path, json=body, headers=intruder)
        assert_error(response, 404, "NOT_FOUND")
    assert (await http.get("/webhook-endpoints", headers=intruder)).json()["data"]["data"] == []
    assert (await http.get("/events", headers=intruder)).json()["data"]["data"] == []
    # Nothing of ours changed.
    still = (await client.get(f"/webhook-endpoints/{endpoint['id']}")).json()["data"]
    assert still["status"] == "enabled" and still["description"] is None


async def test_only_catalogued_event_types_can_be_recorded(
    service: Service, acme: Credential
) -> None:
    with pytest.raises(ValueError, match="catalogue"):
        async with service.db.transaction() as conn:
            await record_event(conn, acme.team_id, "message.teleported")
