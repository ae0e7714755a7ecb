"""Migrations: ordered, applied once, safe when two processes start together."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio
import triopg

from tests.conftest import fresh_database
from tidings.storage.migrate import load_migrations, migrate


@pytest.fixture
async def empty_database(pg_admin_url: str, asyncio_bridge: None) -> AsyncIterator[str]:
    async with fresh_database(pg_admin_url) as url:
        yield url


def test_migrations_are_numbered_in_order() -> None:
    versions = [m.version for m in load_migrations()]
    assert versions == sorted(versions)
    assert versions[0] == 1
    assert len(set(versions)) == len(versions)


async def test_concurrent_starts_apply_each_migration_once(empty_database: str) -> None:
    results: list[list[str]] = []

    async def start() -> None:
        async with triopg.connect(empty_database) as conn:
            results.append(await migrate(conn))

    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(start)
    applied = [name for result in results for name in result]
    expected = [f"{m.version:04d}_{m.name}" for m in load_migrations()]
    assert applied == expected
    async with triopg.connect(empty_database) as conn:
        rows = await conn.fetch("SELECT version FROM schema_migrations ORDER BY version")
        assert [r["version"] for r in rows] == [m.version for m in load_migrations()]
        # And a later start has nothing to do.
        assert await migrate(conn) == []
