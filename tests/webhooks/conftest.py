"""Webhook tests: a service that may reach loopback receivers, with fast retries."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import httpx
import pytest
import trio

from tests.conftest import Credential
from tests.webhooks.receiver import Receiver, Respond, ok
from tidings.app import serve_http
from tidings.config import Config
from tidings.permissions import ALL_PERMISSIONS
from tidings.service import Service, open_service
from tidings.storage import tokens as token_store
from tidings.storage.events import record_event
from tidings.webhooks.safety import Resolver, system_resolve

FAST = {
    # Receivers listen on 127.0.0.1.
    "webhook_allow_private_urls": True,
    "webhook_retry_schedule": (0, 0.3, 0.6),
    "webhook_timeout_seconds": 1.0,
    "webhook_poll_seconds": 0.2,
}


@pytest.fixture
def config(database_url: str, request: pytest.FixtureRequest) -> Config:
    """Fast webhook settings, changed by a test's ``@pytest.mark.settings(...)``."""
    marker = request.node.get_closest_marker("settings")
    changes = {} if marker is None else marker.kwargs
    return Config(
        database_url=database_url,
        db_pool_size=6,
        rate_limit_per_second=0,
        shutdown_grace_seconds=2,
        **{**FAST, **changes},
    )


MakeReceiver = Callable[..., Awaitable[Receiver]]


@pytest.fixture
def make_receiver(nursery: trio.Nursery) -> MakeReceiver:
    """``await make_receiver(respond)``: a receiver listening until the test ends."""

    async def make(respond: Respond = ok) -> Receiver:
        receiver = Receiver(respond)
        await nursery.start(receiver.serve)
        return receiver

    return make


Emit = Callable[..., Awaitable[UUID]]


def emitter(service: Service, team_id: UUID) -> Emit:
    """``await emit("message.delivered", ...)``: record an event as a group would."""

    async def emit_event(
        type: str = "message.delivered", team_id: UUID = team_id, **fields: Any
    ) -> UUID:
        fields.setdefault("channel", "email")
        fields.setdefault("recipient", "ada@example.com")
        async with service.db.transaction() as conn:
            event, _count = await record_event(conn, team_id, type, **fields)
        return event.id

    return emit_event


@pytest.fixture
def emit(service: Service, acme: Credential) -> Emit:
    return emitter(service, acme.team_id)


async def create_endpoint(
    client: httpx.AsyncClient, url: str, events: list[str] | None = None
) -> dict[str, Any]:
    response = await client.post(
        "/webhook-endpoints", json={"url": url, "events": events or ["*"]}
    )
    assert response.status_code == 201, response.text
    endpoint: dict[str, Any] = response.json()["data"]
    return endpoint


async def wait_until(
    check: Callable[[], Awaitable[bool]], within: float = 10, every: float = 0.05
) -> None:
    with trio.fail_after(within):
        while not await check():
            await trio.sleep(every)


async def delivery_of(client: httpx.AsyncClient, endpoint_id: str) -> list[dict[str, Any]]:
    response = await client.get(f"/webhook-endpoints/{endpoint_id}/deliveries")
    assert response.status_code == 200, response.text
    deliveries: list[dict[str, Any]] = response.json()["data"]["data"]
    return deliveries


@dataclass(frozen=True)
class Custom:
    service: Service
    client: httpx.AsyncClient
    emit: Emit


@asynccontextmanager
async def custom_service(
    database_url: str, *, resolve: Resolver = system_resolve, **settings: Any
) -> AsyncIterator[Custom]:
    """The only service on the test's database, with its own settings.

    For tests that must not share their database with the ``service``
    fixture's (which would deliver too).
    """
    config = Config(
        database_url=database_url, db_pool_size=6, rate_limit_per_second=0,
        shutdown_grace_seconds=2, **{**FAST, **settings},
    )
    async with open_service(config, resolve=resolve) as service, trio.open_nursery() as nursery:
        async with service.db.transaction() as conn:
            team_id = await token_store.ensure_team(conn, "acme")
            _token, secret = await token_store.create_token(conn, team_id, ALL_PERMISSIONS)
        binds = await nursery.start(serve_http, service, "127.0.0.1", 0)
        async with httpx.AsyncClient(
            base_url=binds[0], headers={"Authorization": f"Bearer {secret}"}, timeout=30
        ) as client:
            yield Custom(service, client, emitter(service, team_id))
        nursery.cancel_scope.cancel()
