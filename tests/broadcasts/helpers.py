"""Helpers of the broadcast tests: drive a fanout by hand, read what it queued."""

from __future__ import annotations

from dataclasses import replace
from typing import Any
from uuid import UUID, uuid4

import httpx
import trio

from tidings.actors.broadcasts import FanoutActor
from tidings.service import Service
from tidings.storage import broadcasts as store
from tidings.storage.broadcasts_batch import Batch


async def hold(service: Service, broadcast_id: str) -> UUID:
    """Lease the broadcast to a made-up process for an hour: its actor cannot take it."""
    owner = uuid4()
    async with service.db.acquire() as conn:
        await conn.execute(
            "UPDATE broadcasts SET lease_owner = $2, leased_until = now() + interval '1 hour' "
            "WHERE id = $1", UUID(broadcast_id), owner,
        )
    return owner


async def sent_while_held(
    client: httpx.AsyncClient, service: Service, body: dict[str, Any]
) -> tuple[str, UUID]:
    """A broadcast made of ``body`` and sent while a made-up process holds it
    (``hold``): the test drives its fanout by hand. Its id and that owner."""
    response = await client.post("/broadcasts", json=body)
    assert response.status_code == 201, response.text
    bid = str(response.json()["data"]["id"])
    owner = await hold(service, bid)
    sent = await client.post(f"/broadcasts/{bid}/send")
    assert sent.status_code == 200, sent.text
    return bid, owner


async def batch_args(service: Service, broadcast_id: str, owner: UUID) -> Batch:
    """What the actor's batches are given, for ``owner``."""
    async with service.db.acquire() as conn:
        team_id = await conn.fetchval(
            "SELECT team_id FROM broadcasts WHERE id = $1", UUID(broadcast_id)
        )
        found = await store.get(conn, team_id, UUID(broadcast_id))
    assert found is not None
    batch = await FanoutActor(UUID(broadcast_id), service.broadcasts)._batch(
        found, "acme.example"
    )
    return replace(batch, owner=owner)


async def wait_status(
    service: Service, broadcast_id: str, *statuses: str, within: float = 20
) -> str:
    with trio.fail_after(within):
        while True:
            async with service.db.acquire() as conn:
                status: str = await conn.fetchval(
                    "SELECT status FROM broadcasts WHERE id = $1", UUID(broadcast_id)
                )
            if status in statuses:
                return status
            await trio.sleep(0.05)


async def emails_of(service: Service, broadcast_id: str) -> list[Any]:
    async with service.db.acquire() as conn:
        return list(await conn.fetch(
            "SELECT id, contact_id, to_addresses, subject, html, text, headers::text, status "
            "FROM emails WHERE broadcast_id = $1", UUID(broadcast_id),
        ))
