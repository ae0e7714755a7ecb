"""Revocation reaches a token that the service has cached, from any process."""

from __future__ import annotations

import os
import sys
from typing import Any

import httpx
import trio
import triopg

from tests.conftest import Credential, MakeToken
from tidings.actors.revocations import PING_SECONDS
from tidings.service import Service


async def wait_listening(service: Service) -> None:
    with trio.fail_after(10):
        while not service.tokens.live:
            await trio.sleep(0.01)


async def test_revocation_by_another_process_evicts_the_cached_token(
    base_url: str, service: Service, acme: Credential, database_url: str
) -> None:
    await wait_listening(service)
    async with httpx.AsyncClient(base_url=base_url, headers=acme.headers) as client:
        assert (await client.post("/contacts", json={"email": "a@example.com"})).status_code == 201
        assert service.tokens.get(_hash(acme)) is not None  # served from memory now
        env = dict(os.environ, DATABASE_URL=database_url)
        await trio.run_process(
            [sys.executable, "-m", "tidings", "tokens", "revoke", str(acme.token_id)],
            env=env, capture_stdout=True,
        )
        response = await client.post("/contacts", json={"email": "b@example.com"})
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "UNAUTHORIZED"


async def test_revocation_over_http_evicts_the_cached_token(
    base_url: str, service: Service, make_token: MakeToken
) -> None:
    await wait_listening(service)
    admin = await make_token(team="acme", step_up=True)
    user = await make_token(team="acme", permissions=["contacts:read"])
    async with httpx.AsyncClient(base_url=base_url) as client:
        missing = "/contacts/00000000-0000-0000-0000-000000000000"
        assert (await client.get(missing, headers=user.headers)).status_code == 404
        revoked = await client.delete(f"/tokens/{user.token_id}", headers=admin.headers)
        assert revoked.status_code == 204
        assert (await client.get(missing, headers=user.headers)).status_code == 401


async def test_a_lookup_that_raced_a_revocation_is_not_cached(
    service: Service, acme: Credential
) -> None:
    await wait_listening(service)
    from tidings.storage import tokens as store

    digest = _hash(acme)
    version = service.tokens.version
    async with service.db.acquire() as conn:
        token = await store.find_by_hash(conn, digest)
        assert token is not None
        # The revocation lands between the lookup and the caching.
        await store.revoke_token(conn, acme.token_id)
    with trio.fail_after(5):
        while service.tokens.version == version:
            await trio.sleep(0.01)
    service.tokens.put(digest, token, version)
    assert service.tokens.get(digest) is None


def _hash(credential: Credential) -> bytes:
    from tidings.storage.tokens import hash_secret

    return hash_secret(credential.secret)


async def test_lookups_of_unknown_tokens_take_at_most_half_the_pool(
    base_url: str, service: Service
) -> None:
    """Tokens that are no tokens are each looked up (none is cached): however
    many arrive at once, they hold at most half the pool's connections."""
    run = service.db.run
    looking = most = 0

    async def watched(unit: Any, *args: Any) -> Any:
        nonlocal looking, most
        if unit.__name__ != "find_by_hash":
            return await run(unit, *args)
        looking += 1
        most = max(most, looking)
        try:
            await trio.sleep(0.1)  # a slow database
            return await run(unit, *args)
        finally:
            looking -= 1

    service.db.run = watched  # type: ignore[method-assign]
    try:
        async with httpx.AsyncClient(base_url=base_url) as client, trio.open_nursery() as nursery:
            answers: list[int] = []

            async def bogus(n: int) -> None:
                response = await client.get(
                    "/contacts", headers={"Authorization": f"Bearer svc_team_bogus{n}"})
                answers.append(response.status_code)

            for n in range(12):
                nursery.start_soon(bogus, n)
    finally:
        del service.db.run
    assert answers == [401] * 12
    assert most == max(1, service.config.db_pool_size // 2)


async def test_the_cache_goes_dark_as_soon_as_its_listener_loses_the_server(
    service: Service, database_url: str
) -> None:
    # A server restart ends every connection, the one that LISTENs too: a
    # revocation made after it would not be heard, so cached tokens must not
    # answer meanwhile.
    await wait_listening(service)
    async with triopg.connect(database_url) as conn:
        ended = await conn.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    assert ended > 1
    with trio.fail_after(PING_SECONDS / 4):  # well before the next ping would tell
        while service.tokens.live:
            await trio.sleep(0.01)
    await wait_listening(service)  # and it listens again
