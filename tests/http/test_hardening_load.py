"""Probes and load shedding: what a process answers when its pool and its slots are full."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import trio

from tests.conftest import assert_error
from tidings.http.system import Readiness
from tidings.service import Service

# A probe must answer well within this, whatever else the process is doing.
PROBE_SECONDS = 1.5


@asynccontextmanager
async def held_pool(service: Service) -> AsyncIterator[None]:
    """Every pooled connection taken, so any request that needs one waits."""
    size = service.config.db_pool_size
    held = 0
    release = trio.Event()

    async def hold() -> None:
        nonlocal held
        async with service.db.acquire():
            held += 1
            await release.wait()

    async with trio.open_nursery() as nursery:
        for _ in range(size):
            nursery.start_soon(hold)
        await wait_for(lambda: held == size)
        try:
            yield
        finally:
            release.set()


async def test_healthz_and_readyz_answer_while_the_pool_is_held(
    http: httpx.AsyncClient, service: Service
) -> None:
    async with held_pool(service):
        with trio.fail_after(PROBE_SECONDS):
            live = await http.get("/healthz")
            ready = await http.get("/readyz")
    assert live.status_code == 200, live.text
    assert live.json() == {"success": True, "data": {"status": "ok"}}
    assert ready.status_code == 200, ready.text
    assert ready.json()["data"] == {"status": "ready"}


async def test_readyz_is_503_while_a_migration_is_missing(
    http: httpx.AsyncClient, service: Service
) -> None:
    async with service.db.acquire() as conn:
        await conn.execute(
            "DELETE FROM schema_migrations WHERE version = "
            "(SELECT max(version) FROM schema_migrations)"
        )
    message = assert_error(await http.get("/readyz"), 503, "SERVICE_UNAVAILABLE")
    assert "migrations not applied" in message
    # Liveness does not depend on storage.
    assert (await http.get("/healthz")).status_code == 200


async def test_readiness_of_unreachable_storage(asyncio_bridge: None) -> None:
    readiness = Readiness("postgresql://nobody@127.0.0.1:1/nothing")
    with trio.fail_after(5):
        assert await readiness.problem() == "storage is unreachable"


async def wait_for(condition: Any) -> None:
    with trio.fail_after(10):
        while not condition():
            await trio.sleep(0.01)
