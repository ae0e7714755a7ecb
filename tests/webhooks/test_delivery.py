"""Delivery: signed requests to real receivers, retries, exhaustion, auto-disable."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from tests.conftest import assert_error
from tests.webhooks.conftest import (
    Emit,
    MakeReceiver,
    create_endpoint,
    delivery_of,
    wait_until,
)
from tests.webhooks.receiver import Answer, Received
from tidings.service import Service
from tidings.storage.webhooks import ROTATED_KEPT
from tidings.webhooks import verify
from tidings.webhooks.signing import WebhookVerificationError


async def failing(_request: Received) -> Answer:
    return 500, b"down for maintenance", {}


async def get_delivery(client: httpx.AsyncClient, delivery_id: str) -> dict[str, Any]:
    response = await client.get(f"/webhook-deliveries/{delivery_id}")
    assert response.status_code == 200, response.text
    delivery: dict[str, Any] = response.json()["data"]
    return delivery


async def get_endpoint(client: httpx.AsyncClient, endpoint_id: str) -> dict[str, Any]:
    response = await client.get(f"/webhook-endpoints/{endpoint_id}")
    assert response.status_code == 200, response.text
    endpoint: dict[str, Any] = response.json()["data"]
    return endpoint


async def settled(client: httpx.AsyncClient, endpoint_id: str, count: int = 1) -> list[Any]:
    """Wait until the endpoint has ``count`` deliveries, all succeeded or failed."""
    found: list[Any] = []

    async def check() -> bool:
        found[:] = await delivery_of(client, endpoint_id)
        return len(found) == count and all(d["status"] in ("succeeded", "failed") for d in found)

    await wait_until(check)
    return found


async def test_an_event_reaches_the_receiver_signed(
    client: httpx.AsyncClient, make_receiver: MakeReceiver, emit: Emit
) -> None:
    receiver = await make_receiver()
    endpoint = await create_endpoint(client, receiver.url, ["message.delivered"])
    message_id = "5d1f7a51-3a56-4b34-9a53-94f1cdf3e0a2"
    event_id = await emit(
        "message.delivered", message_id=message_id, data={"provider": "sandbox"}
    )
    [request] = await receiver.wait_for(1)

    assert request.method == "POST" and request.path == "/hook"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["x-service-event"] == "message.delivered"
    event = verify(request.body, request.headers["x-service-signature"], [endpoint["secret"]])
    assert event == {
        "id": str(event_id),
        "event": "message.delivered",
        "message_id": message_id,
        "channel": "email",
        "to": "ada@example.com",
        "occurred_at": event["occurred_at"],
        "data": {"provider": "sandbox"},
    }
    assert event["occurred_at"].endswith("Z")

    [delivery] = await settled(client, endpoint["id"])
    assert request.headers["x-service-delivery"] == delivery["id"]
    assert delivery["status"] == "succeeded"
    assert delivery["event_id"] == str(event_id)
    assert delivery["attempt_count"] == 1
    assert delivery["response_status"] == 200
    full = await get_delivery(client, delivery["id"])
    [attempt] = full["attempts"]
    assert attempt["number"] == 1
    assert attempt["response_status"] == 200
    assert attempt["response_body"] == "ok"
    assert attempt["error"] is None
    assert attempt["duration_ms"] >= 0


async def test_only_subscribed_endpoints_get_an_event(
    client: httpx.AsyncClient, make_receiver: MakeReceiver, emit: Emit
) -> None:
    everything, delivered_only, sent_only = [await make_receiver() for _ in range(3)]
    await create_endpoint(client, everything.url, ["*"])
    await create_endpoint(client, delivered_only.url, ["message.delivered"])
    await create_endpoint(client, sent_only.url, ["message.sent", "message.bounced"])
    await emit("message.delivered")
    await emit("message.bounced")
    await everything.wait_for(2)
    await delivered_only.wait_for(1)
    await sent_only.wait_for(1)
    await trio.sleep(0.3)
    assert [r.event["event"] for r in delivered_only.requests] == ["message.delivered"]
    assert [r.event["event"] for r in sent_only.requests] == ["message.bounced"]
    assert sorted(r.event["event"] for r in everything.requests) == [
        "message.bounced", "message.delivered",
    ]


async def test_another_teams_event_goes_to_none_of_ours(
    client: httpx.AsyncClient, make_receiver: MakeReceiver, emit: Emit, make_token: Any
) -> None:
    receiver = await make_receiver()
    await create_endpoint(client, receiver.url)
    other = await make_token(team="globex")
    await emit("message.delivered", team_id=other.team_id)
    await trio.sleep(0.5)
    assert receiver.requests == []


async def test_the_response_body_is_kept_to_2_kib(
    client: httpx.AsyncClient, make_receiver: MakeReceiver, emit: Emit
) -> None:
    async def chatty(_request: Received) -> Answer:
        return 200, b"x" * 5000, {}

    receiver = await make_receiver(chatty)
    endpoint = await create_endpoint(client, receiver.url)
    await emit()
    [delivery] = await settled(client, endpoint["id"])
    assert delivery["response_body"] == "x" * 2048
    assert (await get_delivery(client, delivery["id"]))["attempts"][0]["response_body"] == (
        "x" * 2048
    )


@pytest.mark.settings(webhook_retry_schedule=(0, 1.0, 0.5))
async def test_failures_retry_on_the_schedule_then_the_delivery_fails(
    client: httpx.AsyncClient, make_receiver: MakeReceiver, emit: Emit
) -> None:
    receiver = await make_receiver(failing)
    endpoint = await create_endpoint(client, receiver.url)
    await emit()
    await receiver.wait_for(1)
    delivery: dict[str, Any] = {}

    async def first_recorded() -> bool:
        [current] = await delivery_of(client, endpoint["id"])
        delivery.update(current)
        return bool(current["attempt_count"] >= 1)

    await wait_until(first_recorded)
    # After the first failure, a second attempt is due in about a second.
    assert delivery["attempt_count"] == 1
    assert delivery["status"] == "retrying"
    assert delivery["next_attempt_at"] is not None
    assert delivery["response_status"] == 500

    [delivery] = await settled(client, endpoint["id"])
    assert delivery["status"] == "failed"
    assert delivery["attempt_count"] == 3  # the schedule 0, 1, 0.5 has three attempts
    assert delivery["next_attempt_at"] is None
    assert delivery["response_body"] == "down for maintenance"
    assert len(receiver.requests) == 3
    gaps = [b.at - a.at for a, b in zip(receiver.requests, receiver.requests[1:], strict=False)]
    # Each wait is the scheduled one (plus up to 10% jitter), not sooner.
    assert 1.0 <= gaps[0] < 1.0 * 1.1 + 0.5, gaps
    assert 0.5 <= gaps[1] < 0.5 * 1.1 + 0.5, gaps
    attempts = (await get_delivery(client, delivery["id"]))["attempts"]
    assert [a["number"] for a in attempts] == [1, 2, 3]
    assert all(a["response_status"] == 500 for a in attempts)
    assert all(a["error"] == "the endpoint answered 500" for a in attempts)

    state = await get_endpoint(client, endpoint["id"])
    assert state["consecutive_failures"] == 1
    assert state["last_failure_at"] is not None
    assert state["status"] == "enabled"


async def test_a_success_resets_consecutive_failures(
    client: httpx.AsyncClient, make_receiver: MakeReceiver, emit: Emit
) -> None:
    healthy = trio.Event()

    async def flaky(_request: Received) -> Answer:
        return (200, b"ok", {}) if healthy.is_set() else (503, b"", {})

    receiver = await make_receiver(flaky)
    endpoint = await create_endpoint(client, receiver.url)
    await emit()
    await settled(client, endpoint["id"])
    assert (await get_endpoint(client, endpoint["id"]))["consecutive_failures"] == 1
    healthy.set()
    await emit()
    await settled(client, endpoint["id"], 2)
    state = await get_endpoint(client, endpoint["id"])
    assert state["consecutive_failures"] == 0
    assert state["last_failure_at"] is not None  # the history stays
    assert len(receiver.requests) == 4


@pytest.mark.settings(webhook_auto_disable_after=2, webhook_retry_schedule=(0,))
async def test_auto_disable_at_the_threshold_and_no_deliveries_while_disabled(
    client: httpx.AsyncClient, make_receiver: MakeReceiver, emit: Emit
) -> None:
    receiver = await make_receiver(failing)
    endpoint = await create_endpoint(client, receiver.url)
    await emit()
    await settled(client, endpoint["id"])
    state = await get_endpoint(client, endpoint["id"])
    assert (state["status"], state["consecutive_failures"]) == ("enabled", 1)
    await emit()
    await settled(client, endpoint["id"], 2)
    state = await get_endpoint(client, endpoint["id"])
    assert state["status"] == "disabled"
    assert state["disabled_reason"] == "failure_threshold"
    assert state["disabled_at"] is not None
    assert state["consecutive_failures"] == 2

    await emit()  # while disabled: no delivery at all
    await trio.sleep(0.5)
    assert len(await delivery_of(client, endpoint["id"])) == 2
    assert len(receiver.requests) == 2

    enabled = await client.post(f"/webhook-endpoints/{endpoint['id']}/enable")
    assert enabled.status_code == 200, enabled.text
    state = enabled.json()["data"]
    assert state["status"] == "enabled"
    assert state["consecutive_failures"] == 0
    assert state["disabled_reason"] is None and state["disabled_at"] is None
    receiver.respond = lambda _request: _ok()
    await emit()
    await receiver.wait_for(3)
    deliveries = await settled(client, endpoint["id"], 3)
    assert deliveries[0]["status"] == "succeeded"


async def _ok() -> Answer:
    return 200, b"ok", {}


async def test_manual_disable_stops_claims_and_enable_resumes_held_deliveries(
    client: httpx.AsyncClient, make_receiver: MakeReceiver, emit: Emit
) -> None:
    receiver = await make_receiver(failing)
    endpoint = await create_endpoint(client, receiver.url)
    await emit()
    await receiver.wait_for(1)
    disabled = await client.post(f"/webhook-endpoints/{endpoint['id']}/disable")
    assert disabled.status_code == 200, disabled.text
    assert disabled.json()["data"]["disabled_reason"] == "manual"
    assert disabled.json()["data"]["disabled_at"] is not None
    seen = len(receiver.requests)
    await trio.sleep(1.2)  # past every scheduled retry
    assert len(receiver.requests) == seen
    [held] = await delivery_of(client, endpoint["id"])
    assert held["status"] == "retrying"

    receiver.respond = lambda _request: _ok()
    await client.post(f"/webhook-endpoints/{endpoint['id']}/enable")
    [delivery] = await settled(client, endpoint["id"])
    assert delivery["status"] == "succeeded"


async def test_manual_retry_only_from_failed(
    client: httpx.AsyncClient, make_receiver: MakeReceiver, emit: Emit
) -> None:
    receiver = await make_receiver(failing)
    endpoint = await create_endpoint(client, receiver.url)
    await emit()
    [delivery] = await settled(client, endpoint["id"])
    assert delivery["status"] == "failed"

    receiver.respond = lambda _request: _ok()
    retried = await client.post(f"/webhook-deliveries/{delivery['id']}/retry")
    assert retried.status_code == 200, retried.text
    assert retried.json()["data"]["status"] == "pending"
    [delivery] = await settled(client, endpoint["id"])
    assert delivery["status"] == "succeeded"
    assert delivery["attempt_count"] == 4
    assert (await get_endpoint(client, endpoint["id"]))["consecutive_failures"] == 0

    message = assert_error(
        await client.post(f"/webhook-deliveries/{delivery['id']}/retry"), 409, "CONFLICT"
    )
    assert "succeeded" in message


async def test_a_failed_manual_retry_is_one_attempt(
    client: httpx.AsyncClient, make_receiver: MakeReceiver, emit: Emit
) -> None:
    receiver = await make_receiver(failing)
    endpoint = await create_endpoint(client, receiver.url)
    await emit()
    [delivery] = await settled(client, endpoint["id"])
    await client.post(f"/webhook-deliveries/{delivery['id']}/retry")
    await receiver.wait_for(4)
    [delivery] = await settled(client, endpoint["id"])
    assert (delivery["status"], delivery["attempt_count"]) == ("failed", 4)
    await trio.sleep(0.8)
    assert len(receiver.requests) == 4
    assert (await get_endpoint(client, endpoint["id"]))["consecutive_failures"] == 2


async def test_a_pending_delivery_cannot_be_retried(
    client: httpx.AsyncClient, make_receiver: MakeReceiver, emit: Emit
) -> None:
    release = trio.Event()

    async def stuck(_request: Received) -> Answer:
        await release.wait()
        return 200, b"", {}

    receiver = await make_receiver(stuck)
    endpoint = await create_endpoint(client, receiver.url)
    await emit()
    await receiver.wait_for(1)
    [delivery] = await delivery_of(client, endpoint["id"])
    assert delivery["status"] == "pending"
    message = assert_error(
        await client.post(f"/webhook-deliveries/{delivery['id']}/retry"), 409, "CONFLICT"
    )
    assert "pending" in message
    release.set()


async def test_no_answer_in_time_is_a_failed_attempt(
    client: httpx.AsyncClient, make_receiver: MakeReceiver, emit: Emit
) -> None:
    async def slow(_request: Received) -> Answer:
        await trio.sleep(5)
        return 200, b"", {}

    receiver = await make_receiver(slow)
    endpoint = await create_endpoint(client, receiver.url)
    await emit()
    await receiver.wait_for(1)

    async def attempted() -> bool:
        [delivery] = await delivery_of(client, endpoint["id"])
        return bool(delivery["attempt_count"] >= 1)

    await wait_until(attempted)
    [delivery] = await delivery_of(client, endpoint["id"])
    attempt = (await get_delivery(client, delivery["id"]))["attempts"][0]
    assert attempt["response_status"] is None
    assert attempt["error"] == "no response within 1 s"
    assert 1000 <= attempt["duration_ms"] < 2000


async def test_redirects_are_not_followed(
    client: httpx.AsyncClient, make_receiver: MakeReceiver, emit: Emit
) -> None:
    elsewhere = await make_receiver()

    async def redirect(_request: Received) -> Answer:
        return 307, b"", {"Location": elsewhere.url}

    receiver = await make_receiver(redirect)
    endpoint = await create_endpoint(client, receiver.url)
    await emit()
    [delivery] = await settled(client, endpoint["id"])
    assert delivery["status"] == "failed"
    assert delivery["response_status"] == 307
    assert elsewhere.requests == []


async def test_an_unreachable_endpoint_records_the_error(
    client: httpx.AsyncClient, emit: Emit
) -> None:
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()  # nothing listens there now
    endpoint = await create_endpoint(client, f"http://127.0.0.1:{port}/hook")
    await emit()
    [delivery] = await settled(client, endpoint["id"])
    assert delivery["status"] == "failed"
    assert delivery["response_status"] is None
    assert delivery["error"].startswith("could not connect")


# A timeout longer than the wait below: attempts to the stuck endpoint that
# timed out would free their slots, and the next ones would count on top of them.
@pytest.mark.settings(webhook_timeout_seconds=5)
async def test_a_dead_endpoint_does_not_delay_another(
    client: httpx.AsyncClient, make_receiver: MakeReceiver, emit: Emit
) -> None:
    async def hang(_request: Received) -> Answer:
        await trio.sleep(5.5)
        return 200, b"", {}

    stuck = await make_receiver(hang)
    fast = await make_receiver()
    await create_endpoint(client, stuck.url)
    await create_endpoint(client, fast.url)
    for _ in range(20):  # more than the stuck endpoint may have in flight
        await emit()
    started = trio.current_time()
    await fast.wait_for(20, within=3)
    assert trio.current_time() - started < 1.0
    assert stuck.most_in_flight <= 8


@pytest.mark.settings(webhook_concurrency=2)
async def test_attempts_in_flight_per_endpoint_are_bounded(
    client: httpx.AsyncClient, make_receiver: MakeReceiver, emit: Emit
) -> None:
    async def slowish(_request: Received) -> Answer:
        await trio.sleep(0.2)
        return 200, b"", {}

    receiver = await make_receiver(slowish)
    endpoint = await create_endpoint(client, receiver.url)
    for _ in range(8):
        await emit()
    await settled(client, endpoint["id"], 8)
    assert receiver.most_in_flight == 2


async def test_a_rotated_secret_signs_alongside_the_new_one(
    client: httpx.AsyncClient, make_receiver: MakeReceiver, emit: Emit
) -> None:
    receiver = await make_receiver()
    endpoint = await create_endpoint(client, receiver.url)
    rotated = await client.post(f"/webhook-endpoints/{endpoint['id']}/rotate-secret")
    assert rotated.status_code == 200, rotated.text
    new_secret = rotated.json()["data"]["secret"]
    assert new_secret.startswith("whsec_") and new_secret != endpoint["secret"]
    await emit()
    [request] = await receiver.wait_for(1)
    header = request.headers["x-service-signature"]
    assert header.count("v1=") == 2
    assert verify(request.body, header, [new_secret])
    assert verify(request.body, header, [endpoint["secret"]])


async def test_every_secret_rotated_out_within_its_time_keeps_signing(
    client: httpx.AsyncClient, make_receiver: MakeReceiver, emit: Emit, service: Service
) -> None:
    """A second rotation within the day does not cut off the first old secret;
    at most ROTATED_KEPT rotated-out secrets sign, the newest; one whose time
    is up signs no more."""
    receiver = await make_receiver()
    endpoint = await create_endpoint(client, receiver.url)
    secrets = [endpoint["secret"]]
    for _ in range(2):
        rotated = await client.post(f"/webhook-endpoints/{endpoint['id']}/rotate-secret")
        secrets.append(rotated.json()["data"]["secret"])
    await emit()
    [request] = await receiver.wait_for(1)
    header = request.headers["x-service-signature"]
    assert header.count("v1=") == 3
    assert all(signs(request.body, header, secret) for secret in secrets)

    for _ in range(ROTATED_KEPT):
        rotated = await client.post(f"/webhook-endpoints/{endpoint['id']}/rotate-secret")
        secrets.append(rotated.json()["data"]["secret"])
    await emit()
    second = (await receiver.wait_for(2))[1]
    header = second.headers["x-service-signature"]
    assert header.count("v1=") == 1 + ROTATED_KEPT
    signing = [s for s in secrets if signs(second.body, header, s)]
    assert signing == secrets[-1 - ROTATED_KEPT:]

    async with service.db.acquire() as conn:
        await conn.execute(
            "UPDATE webhook_endpoints SET previous_secrets_until = "
            "array_fill(now() - interval '1 second', ARRAY[cardinality(previous_secrets)])"
        )
    await emit()
    last = (await receiver.wait_for(3))[2]
    header = last.headers["x-service-signature"]
    assert header.count("v1=") == 1 and verify(last.body, header, [secrets[-1]])


def signs(body: bytes, header: str, secret: str) -> bool:
    try:
        return bool(verify(body, header, [secret]))
    except WebhookVerificationError:
        return False


async def test_the_test_event_goes_to_that_endpoint_alone(
    client: httpx.AsyncClient, make_receiver: MakeReceiver
) -> None:
    target, bystander = await make_receiver(), await make_receiver()
    endpoint = await create_endpoint(client, target.url, ["message.delivered"])
    await create_endpoint(client, bystander.url, ["*"])
    answered = await client.post(f"/webhook-endpoints/{endpoint['id']}/test")
    assert answered.status_code == 202, answered.text
    delivery = answered.json()["data"]
    assert delivery["event_type"] == "webhook.test"
    [request] = await target.wait_for(1)
    assert request.event["event"] == "webhook.test"
    assert request.event["id"] == delivery["event_id"]
    assert request.headers["x-service-delivery"] == delivery["id"]
    await trio.sleep(0.3)
    assert bystander.requests == []


async def test_delete_removes_deliveries_and_attempts_but_keeps_events(
    client: httpx.AsyncClient, make_receiver: MakeReceiver, emit: Emit, service: Service
) -> None:
    receiver = await make_receiver(failing)
    endpoint = await create_endpoint(client, receiver.url)
    event_id = await emit()
    [delivery] = await settled(client, endpoint["id"])
    deleted = await client.delete(f"/webhook-endpoints/{endpoint['id']}")
    assert deleted.status_code == 204 and deleted.content == b""
    assert_error(await client.get(f"/webhook-endpoints/{endpoint['id']}"), 404, "NOT_FOUND")
    assert_error(await client.get(f"/webhook-deliveries/{delivery['id']}"), 404, "NOT_FOUND")
    async with service.db.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM webhook_deliveries") == 0
        assert await conn.fetchval("SELECT count(*) FROM webhook_attempts") == 0
    kept = await client.get(f"/events/{event_id}")
    assert kept.status_code == 200, kept.text


async def test_attempts_are_counted_in_the_metrics(
    client: httpx.AsyncClient, make_receiver: MakeReceiver, emit: Emit
) -> None:
    receiver = await make_receiver(failing)
    endpoint = await create_endpoint(client, receiver.url)
    await emit()
    await settled(client, endpoint["id"])
    receiver.respond = lambda _request: _ok()
    await emit()
    await settled(client, endpoint["id"], 2)
    text = (await client.get("/metrics")).text
    assert 'tidings_webhook_attempts_total{result="retrying"} 2.0' in text
    assert 'tidings_webhook_attempts_total{result="failed"} 1.0' in text
    assert 'tidings_webhook_attempts_total{result="succeeded"} 1.0' in text


@pytest.mark.settings(webhook_retry_schedule=(0.8, 0.3))
async def test_the_first_number_of_the_schedule_delays_the_first_attempt(
    client: httpx.AsyncClient, make_receiver: MakeReceiver, emit: Emit
) -> None:
    receiver = await make_receiver()
    await create_endpoint(client, receiver.url)
    committed = trio.current_time()
    await emit()
    [request] = await receiver.wait_for(1)
    assert 0.8 <= request.at - committed < 2.5
