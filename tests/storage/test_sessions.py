"""The sessions of both pools: a transaction left idle by a process that
stopped running does not hold its locks for as long as its connection lives."""

from __future__ import annotations

from tidings.service import Service
from tidings.storage.connection import AsyncioConnection


async def _timeout(conn: AsyncioConnection) -> str:
    shown: str = await conn.fetchval("SHOW idle_in_transaction_session_timeout")
    return shown


async def test_both_pools_end_a_transaction_idle_for_a_minute(service: Service) -> None:
    async with service.db.acquire() as conn:
        assert await conn.fetchval("SHOW idle_in_transaction_session_timeout") == "1min"
    assert await service.db.run(_timeout) == "1min"
