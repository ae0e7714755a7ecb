"""A connection the server ends is storage unavailable (503), whenever the
next query meets it."""

from __future__ import annotations

import asyncio

import asyncpg
import trio

from tidings.storage.errors import unavailable

TRIES = 40


def _queries_after_the_server_ended_them(url: str) -> list[BaseException]:
    """End connections from the server's side (as a shutdown or an operator's
    pg_terminate_backend does) and query each at once: the errors asyncpg
    raises, which depend on how much of the server's farewell it has read."""

    async def main() -> list[BaseException]:
        errors: list[BaseException] = []
        killer = await asyncpg.connect(url)
        try:
            for _ in range(TRIES):
                victim = await asyncpg.connect(url)
                await killer.execute("SELECT pg_terminate_backend($1)", victim.get_server_pid())
                try:
                    await victim.fetchval("SELECT 1")
                except Exception as error:  # what it is, is the point
                    errors.append(error)
                finally:
                    victim.terminate()
        finally:
            await killer.close()
        return errors

    return asyncio.run(main())


async def test_a_query_on_a_connection_the_server_ended_is_unavailable(database_url: str) -> None:
    errors = await trio.to_thread.run_sync(_queries_after_the_server_ended_them, database_url)
    assert len(errors) == TRIES
    assert [repr(e) for e in errors if not unavailable(e)] == []
