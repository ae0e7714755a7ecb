"""A request to a storage-unit route crosses from trio to asyncio once."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import trio

from tidings.logging_setup import request_id
from tidings.service import Service
from tidings.storage.db import AsyncioConnection


@contextmanager
def counting_crossings(service: Service) -> Iterator[list[str]]:
    """Count ``Database.run`` calls; any use of the trio-side connection proxy fails."""
    db = service.db
    runs: list[str] = []
    run = db.run

    async def counted(unit: Any, *args: Any) -> Any:
        # Actors (the retention sweeper, due follow-ups) run on their own
        # time, not for a request: only a request's task has a request id.
        if request_id.get() is not None:
            runs.append(unit.__name__)
        return await run(unit, *args)

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a storage-unit request used the trio-side connection proxy")

    db.run, db.acquire, db.transaction = counted, refused, refused  # type: ignore[method-assign]
    try:
        yield runs
    finally:
        del db.run, db.acquire, db.transaction


# What asyncpg sends on its own when a connection first meets a type.
ASYNCPG_OWN = ("typeinfo_tree", "set_config('jit'")


@contextmanager
def counting_statements(service: Service) -> Iterator[list[str]]:
    """The statements that requests' storage units send to PostgreSQL, as
    asyncpg's query loggers see them, but for asyncpg's own lookup of the
    types a connection meets for the first time."""
    db = service.db
    sent: list[str] = []
    run = db.run

    async def counted(unit: Any, *args: Any) -> Any:
        if request_id.get() is None:  # an actor's, not a request's
            return await run(unit, *args)
        return await run(logged(unit), *args)

    def logged(unit: Any) -> Any:
        async def logged_unit(conn: AsyncioConnection, *args: Any, **kwargs: Any) -> Any:
            def record(query: Any) -> None:
                if not any(own in query.query for own in ASYNCPG_OWN):
                    sent.append(query.query)
            conn.add_query_logger(record)
            try:
                return await unit(conn, *args, **kwargs)
            finally:
                conn.remove_query_logger(record)
        return logged_unit

    db.run = counted  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        del db.run


async def test_post_contacts_is_one_crossing_with_and_without_a_key(
    client: httpx.AsyncClient, service: Service
) -> None:
    with trio.fail_after(10):  # the cache answers once the revocation listener is live
        while not service.tokens.live:
            await trio.sleep(0.01)
    with counting_crossings(service) as runs:
        # The first request of a token looks it up first, before its body is
        # read: a crossing of its own, once per token and process.
        assert (await client.post("/contacts", json={"email": "a@example.com"})).status_code == 201
        assert runs == ["find_by_hash", "run_unit"]
        runs.clear()
        assert (await client.post("/contacts", json={"email": "b@example.com"})).status_code == 201
        assert runs == ["run_unit"]
        runs.clear()
        headers = {"Idempotency-Key": "k1"}
        first = await client.post("/contacts", json={"email": "c@example.com"}, headers=headers)
        assert first.status_code == 201
        assert runs == ["run_unit"]
        runs.clear()
        replay = await client.post("/contacts", json={"email": "c@example.com"}, headers=headers)
        assert replay.headers["Idempotent-Replayed"] == "true"
        assert replay.content == first.content
        assert runs == ["run_unit"]
        runs.clear()
        failed = await client.post("/contacts", json={"email": "a@example.com"}, headers={
            "Idempotency-Key": "k2"
        })
        assert failed.status_code == 409
        assert runs == ["run_unit"]
    retried = await client.post("/contacts", json={"email": "d@example.com"}, headers={
        "Idempotency-Key": "k2"
    })
    assert retried.status_code == 201, "a failed request released its key"
