"""A route that waits outside holding no connection (``pooled=False``) still
commits its writes with its stored response: a request whose idempotency
lock expired while it waited leaves nothing behind, and the retry runs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import trio

from tests.conftest import assert_error
from tests.webhooks.conftest import FAST
from tidings.app import serve_http
from tidings.config import Config
from tidings.permissions import ALL_PERMISSIONS
from tidings.service import open_service
from tidings.storage import tokens as token_store

PUBLIC = "93.184.215.14"


@asynccontextmanager
async def slow_names(
    database_url: str, gate: trio.Event, resolving: list[str]
) -> AsyncIterator[httpx.AsyncClient]:
    """A service whose names resolve once ``gate`` is set, whose idempotency
    locks last a second, and a client of it."""

    async def resolve(host: str, port: int) -> list[str]:
        resolving.append(host)
        await gate.wait()
        return [PUBLIC]

    config = Config(
        database_url=database_url, db_pool_size=6, rate_limit_per_second=0,
        shutdown_grace_seconds=2, idempotency_lock_seconds=1,
        **{**FAST, "webhook_allow_private_urls": False},
    )
    async with open_service(config, resolve=resolve) as service, trio.open_nursery() as nursery:
        async with service.db.transaction() as conn:
            team_id = await token_store.ensure_team(conn, "acme")
            _token, secret = await token_store.create_token(conn, team_id, ALL_PERMISSIONS)
        binds = await nursery.start(serve_http, service, "127.0.0.1", 0)
        async with httpx.AsyncClient(
            base_url=binds[0], headers={"Authorization": f"Bearer {secret}"}, timeout=30
        ) as client:
            yield client
        nursery.cancel_scope.cancel()


async def test_a_create_whose_lock_expired_while_it_waited_leaves_nothing(
    database_url: str,
) -> None:
    gate = trio.Event()
    resolving: list[str] = []
    body = {"url": "https://slow.example.com/hook", "events": ["*"]}
    headers = {"Idempotency-Key": "create-once"}
    async with slow_names(database_url, gate, resolving) as client:
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
