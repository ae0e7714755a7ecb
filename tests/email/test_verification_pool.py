"""``POST /domains/{id}/verify`` holds no pooled connection while it waits on
name servers: with every connection of a small pool otherwise taken by
verifications, the team's other requests are answered before they end."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from tests.email.conftest import dns_config
from tests.email.dns_server import Zone
from tests.http.audience import ok
from tidings.config import Config

POOL = 2  # TIDINGS_DB_POOL_SIZE: the smallest allowed; two verifications at once per team


@pytest.fixture
def config(database_url: str, zone: tuple[Zone, tuple[str, int]]) -> Config:
    return dns_config(database_url, zone[1], POOL)


async def test_verifications_waiting_on_dns_leave_the_pool_to_other_requests(
    client: httpx.AsyncClient, zone: tuple[Zone, Any]
) -> None:
    domains = [ok(await client.post("/domains", json={"name": f"d{n}.example"}), 201)
               for n in range(POOL)]
    zone[0].delay = 1.5  # each answer: within a try's 2 s
    finished: list[str] = []

    async def verify(domain_id: str) -> None:
        ok(await client.post(f"/domains/{domain_id}/verify"))
        finished.append("verify")

    async with trio.open_nursery() as nursery:
        for domain in domains:
            nursery.start_soon(verify, domain["id"])
        await trio.sleep(0.3)  # both are asking the name server now
        listed = ok(await client.get("/domains"))
        finished.append("list")
    assert len(listed["data"]) == POOL
    assert finished[0] == "list", finished
