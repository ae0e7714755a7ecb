"""A route that waits outside holding no connection (``pooled=False``) still
commits its writes with its stored response: a request whose idempotency
lock expired while it waited leaves nothing behind, and the retry runs."""

from __future__ import annotations

import httpx
import trio

from tests.conftest import assert_error
from tests.webhooks.conftest import custom_service

PUBLIC = "93.184.215.14"


async def test_a_create_whose_lock_expired_while_it_waited_leaves_nothing(
    database_url: str,
) -> None:
    gate = trio.Event()
    resolving: list[str] = []
    body = {"url": "https://slow.example.com/hook", "events": ["*"]}
    headers = {"Idempotency-Key": "create-once"}
    async def resolve(host: str, port: int) -> list[str]:
        resolving.append(host)
        await gate.wait()
        return [PUBLIC]

    async with custom_service(
        database_url, resolve=resolve, idempotency_lock_seconds=1,
        webhook_allow_private_urls=False,
    ) as custom:
        client = custom.client
        answers: list[httpx.Response] = []

        async def first() -> None:
            answers.append(await client.post("/webhook-endpoints", json=body, headers=headers))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            with trio.fail_after(5):
                while not resolving:
                    await trio.sleep(0.01)
            await trio.sleep(1.2)  # past IDEMPOTENCY_LOCK_SECONDS
            expired = await client.post("/webhook-endpoints", json=body, headers=headers)
            assert "expired" in assert_error(expired, 409, "CONFLICT")
            gate.set()
        assert_error(answers[0], 409, "CONFLICT")  # its claim was lost: rolled back
        listed = (await client.get("/webhook-endpoints")).json()["data"]["data"]
        assert listed == []
        retried = await client.post("/webhook-endpoints", json=body, headers=headers)
        assert retried.status_code == 201, retried.text
        listed = (await client.get("/webhook-endpoints")).json()["data"]["data"]
        assert [endpoint["id"] for endpoint in listed] == [retried.json()["data"]["id"]]
