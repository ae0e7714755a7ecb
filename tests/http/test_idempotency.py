"""The seven idempotency rules of the spec, over real HTTP and PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any
from uuid import uuid4

import httpx
import pytest
import trio

from tests.conftest import Credential, MakeToken
from tidings.app import serve_http
from tidings.config import Config
from tidings.http.idempotency_key import fingerprint
from tidings.service import Service, open_service
from tidings.storage import idempotency as records

KEY = "Idempotency-Key"


async def count_contacts(service: Service) -> int:
    async with service.db.acquire() as conn:
        count: int = await conn.fetchval("SELECT count(*) FROM contacts")
    return count


async def post(
    client: httpx.AsyncClient, body: dict[str, Any], key: str | None
) -> httpx.Response:
    # Bytes, so that a key may hold any UTF-8 character.
    headers: dict[bytes, bytes] = {} if key is None else {KEY.encode(): key.encode()}
    return await client.post("/contacts", json=body, headers=headers)


async def test_replay_returns_stored_response_without_executing_again(
    client: httpx.AsyncClient, service: Service
) -> None:
    first = await post(client, {"email": "a@example.com"}, "key-1")
    assert first.status_code == 201
    assert "Idempotent-Replayed" not in first.headers
    again = await post(client, {"email": "a@example.com"}, "key-1")
    assert again.status_code == 201
    assert again.content == first.content
    assert again.headers["Idempotent-Replayed"] == "true"
    assert await count_contacts(service) == 1


# HTTP itself strips the whitespace around a header value, so a blank key
# arrives empty.
@pytest.mark.parametrize("key", ["", "k" * 257])
async def test_blank_or_long_keys_are_rejected(
    client: httpx.AsyncClient, service: Service, key: str
) -> None:
    response = await post(client, {"email": "a@example.com"}, key)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "BAD_REQUEST"
    assert "Idempotency-Key" in error["message"]
    assert await count_contacts(service) == 0


@pytest.mark.parametrize("raw", [b"q\xff", b"a\x01b", b"a\x7fb", b"a\xc2\x85b"])
async def test_a_key_that_is_not_text_is_refused(
    client: httpx.AsyncClient, service: Service, raw: bytes
) -> None:
    """Bytes that are not UTF-8 (read as latin-1, q\\xff would be the UTF-8 key
    "qÿ") and control characters are no key."""
    response = await client.post("/contacts", json={"email": "a@example.com"},
                                 headers={KEY.encode(): raw})
    assert response.status_code == 400, response.text
    assert "Idempotency-Key" in response.json()["error"]["message"]
    assert await count_contacts(service) == 0
    assert (await post(client, {"email": "a@example.com"}, "qÿ")).status_code == 201


async def test_two_key_headers_are_refused(client: httpx.AsyncClient, service: Service) -> None:
    """Which of two a proxy or a framework would pick is anyone's guess."""
    for path, body in [("/contacts", {"email": "two@example.com"}),
                       ("/webhook-endpoints", {"url": "https://example.com/hook",
                                               "events": ["*"]})]:
        response = await client.post(path, json=body, headers=[(KEY, "k1"), (KEY, "k2")])
        assert response.status_code == 400, response.text
        assert "more than one Idempotency-Key" in response.json()["error"]["message"]
    assert await count_contacts(service) == 0


async def test_key_of_256_characters_is_accepted(client: httpx.AsyncClient) -> None:
    response = await post(client, {"email": "a@example.com"}, "k" * 256)
    assert response.status_code == 201
    # Length counts characters (sent as UTF-8), not bytes.
    response = await post(client, {"email": "b@example.com"}, "é" * 256)
    assert response.status_code == 201
    response = await post(client, {"email": "c@example.com"}, "é" * 257)
    assert response.status_code == 400


async def test_same_key_different_request_is_a_conflict(
    client: httpx.AsyncClient, service: Service
) -> None:
    assert (await post(client, {"email": "a@example.com"}, "k")).status_code == 201
    response = await client.post("/contacts", json={"email": "other@example.com"},
                                 headers={KEY: "k"})
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "CONFLICT"
    assert "different request" in error["message"]
    assert await count_contacts(service) == 1
    # A different request that is itself invalid is told of the key first
    # (spec, idempotency rule 4), on a storage-unit route as on one that
    # claims its key ahead of the work (webhook endpoints).
    for refused in (
        client.post("/contacts?dry=1", json={"email": "a@example.com"}, headers={KEY: "k"}),
        client.post("/contacts", json={"email": 5}, headers={KEY: "k"}),
        client.post("/contacts", content=b"not json", headers={KEY: "k"}),
    ):
        response = await refused
        assert response.status_code == 409, response.text
        assert "different request" in response.json()["error"]["message"]
    assert await count_contacts(service) == 1
    hook = {"url": "https://example.com/hook", "events": ["*"]}
    created = await client.post("/webhook-endpoints", json=hook, headers={KEY: "w"})
    assert created.status_code == 201
    response = await client.post("/webhook-endpoints", json={"url": 5}, headers={KEY: "w"})
    assert response.status_code == 409
    assert "different request" in response.json()["error"]["message"]
    # A free key leaves the refusal as it is.
    response = await client.post("/webhook-endpoints", json={"url": 5}, headers={KEY: "free"})
    assert response.status_code == 400
    response = await client.post("/contacts", json={"email": 5}, headers={KEY: "free"})
    assert response.status_code == 400


def test_the_fingerprint_is_method_route_path_query_and_body() -> None:
    """Spec, Idempotency 2: two requests are the same when all four are."""
    base = fingerprint("POST", "/contacts", b"", b'{"a": 1}')
    assert fingerprint("POST", "//contacts/", b"", b'{"a": 1}') == base  # one route path
    for other in (
        fingerprint("PUT", "/contacts", b"", b'{"a": 1}'),
        fingerprint("POST", "/contacts/x", b"", b'{"a": 1}'),
        fingerprint("POST", "/contacts", b"dry=1", b'{"a": 1}'),
        fingerprint("POST", "/contacts", b"", b'{"a": 2}'),
    ):
        assert other != base


async def test_keys_are_scoped_to_the_credential(
    client: httpx.AsyncClient, base_url: str, make_token: MakeToken, service: Service
) -> None:
    first = await post(client, {"email": "a@example.com"}, "shared")
    other: Credential = await make_token(team="globex")
    async with httpx.AsyncClient(base_url=base_url, headers=other.headers) as globex:
        second = await post(globex, {"email": "a@example.com"}, "shared")
    assert second.status_code == 201
    assert "Idempotent-Replayed" not in second.headers
    assert second.json()["data"]["id"] != first.json()["data"]["id"]
    assert second.json()["data"]["team_id"] == str(other.team_id)
    assert await count_contacts(service) == 2


async def test_a_failed_request_does_not_pin_its_key(
    client: httpx.AsyncClient, service: Service
) -> None:
    assert (await post(client, {"email": "taken@example.com"}, None)).status_code == 201
    failed = await post(client, {"email": "taken@example.com"}, "retry-me")
    assert failed.status_code == 409
    async with service.db.acquire() as conn:
        await conn.execute("DELETE FROM contacts")
    retried = await post(client, {"email": "taken@example.com"}, "retry-me")
    assert retried.status_code == 201
    assert "Idempotent-Replayed" not in retried.headers
    assert await count_contacts(service) == 1


async def hold_table_lock(
    service: Service, release: trio.Event, table: str, *, task_status: Any
) -> None:
    """Block every write to ``table`` until ``release`` is set."""
    async with service.db.transaction() as conn:
        await conn.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE")
        task_status.started()
        await release.wait()


async def wait_until_blocked(service: Service) -> None:
    """Until a request waits for the lock of ``hold_table_lock``."""
    while True:
        async with service.db.acquire() as conn:
            waiting = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
        if waiting:
            return
        await trio.sleep(0.02)


@asynccontextmanager
async def held_up(
    service: Service, request: Callable[[], Awaitable[httpx.Response]], table: str = "contacts"
) -> AsyncIterator[list[httpx.Response]]:
    """Sends ``request`` while ``table`` is locked; inside the block it waits
    for the lock, and the block's end lets it go. Yields the list its answer
    goes into."""
    release = trio.Event()
    results: list[httpx.Response] = []

    async def send() -> None:
        results.append(await request())

    async with trio.open_nursery() as nursery:
        await nursery.start(hold_table_lock, service, release, table)
        nursery.start_soon(send)
        await wait_until_blocked(service)
        try:
            yield results
        finally:
            release.set()


async def test_same_key_while_processing_is_a_conflict(
    client: httpx.AsyncClient, service: Service
) -> None:
    async with held_up(
        service, lambda: post(client, {"email": "slow@example.com"}, "slow")
    ) as results:
        second = await post(client, {"email": "slow@example.com"}, "slow")
        assert second.status_code == 409
        assert second.json()["error"]["code"] == "CONFLICT"
        assert "still processing" in second.json()["error"]["message"]
        assert second.headers["Retry-After"] == "1"  # when to ask again
    assert results[0].status_code == 201
    replay = await post(client, {"email": "slow@example.com"}, "slow")
    assert replay.content == results[0].content
    assert await count_contacts(service) == 1


@asynccontextmanager
async def custom_service(
    database_url: str, credential: Credential, **settings: Any
) -> AsyncIterator[tuple[Service, httpx.AsyncClient]]:
    """A service with its own settings on the test's database, and a client of it."""
    config = Config(
        database_url=database_url, db_pool_size=6, rate_limit_per_second=0,
        shutdown_grace_seconds=2, **settings,
    )
    async with open_service(config) as service, trio.open_nursery() as nursery:
        binds = await nursery.start(serve_http, service, "127.0.0.1", 0)
        async with httpx.AsyncClient(base_url=binds[0], headers=credential.headers) as client:
            yield service, client
        nursery.cancel_scope.cancel()


async def test_expired_processing_lock_says_so_and_the_retry_runs(
    database_url: str, acme: Credential
) -> None:
    async with custom_service(database_url, acme, idempotency_lock_seconds=1) as (service, client):
        await expired_lock_scenario(service, client)


async def expired_lock_scenario(service: Service, client: httpx.AsyncClient) -> None:
    async with held_up(
        service, lambda: post(client, {"email": "stuck@example.com"}, "stuck")
    ) as results:
        await trio.sleep(1.2)  # past IDEMPOTENCY_LOCK_SECONDS=1
        expired = await post(client, {"email": "stuck@example.com"}, "stuck")
        assert expired.status_code == 409
        assert "expired" in expired.json()["error"]["message"]
    # The stuck attempt lost its claim: it must not commit.
    assert results[0].status_code == 409
    assert await count_contacts(service) == 0
    retried = await post(client, {"email": "stuck@example.com"}, "stuck")
    assert retried.status_code == 201
    assert await count_contacts(service) == 1


async def test_concurrent_identical_requests_execute_once(
    client: httpx.AsyncClient, service: Service
) -> None:
    responses: list[httpx.Response] = []

    async def send() -> None:
        responses.append(await post(client, {"email": "race@example.com"}, "race"))

    async with trio.open_nursery() as nursery:
        for _ in range(12):
            nursery.start_soon(send)
    created = [r for r in responses if r.status_code == 201]
    assert created, [r.text for r in responses]
    assert {r.json()["data"]["id"] for r in created} == {created[0].json()["data"]["id"]}
    assert all(r.status_code in (201, 409) for r in responses)
    assert await count_contacts(service) == 1


async def test_two_processes_on_one_database_execute_a_key_once(
    database_url: str, client: httpx.AsyncClient, acme: Credential, service: Service
) -> None:
    """A second service on the same database has its own shards: only
    PostgreSQL's unique key stands between them."""
    responses: list[httpx.Response] = []

    async def send(target: httpx.AsyncClient) -> None:
        responses.append(await post(target, {"email": "both@example.com"}, "both"))

    async with custom_service(database_url, acme) as (_, second):
        async with trio.open_nursery() as senders:
            for index in range(10):
                senders.start_soon(send, client if index % 2 else second)
    created = {r.json()["data"]["id"] for r in responses if r.status_code == 201}
    assert len(created) == 1
    assert await count_contacts(service) == 1


async def test_records_expire_after_retention_and_are_swept(
    database_url: str, acme: Credential
) -> None:
    async with custom_service(
        database_url, acme, idempotency_retention_seconds=1, idempotency_sweep_seconds=0.2
    ) as (service, client):
        assert (await post(client, {"email": "a@example.com"}, "old")).status_code == 201
        await trio.sleep(1.5)
        async with service.db.acquire() as conn:
            left = await conn.fetchval("SELECT count(*) FROM idempotency_keys")
        assert left == 0
        # The key is free again: a different request with it executes.
        reused = await post(client, {"email": "b@example.com"}, "old")
        assert reused.status_code == 201


async def test_spellings_of_one_route_path_are_one_request(
    client: httpx.AsyncClient, service: Service
) -> None:
    first = await post(client, {"email": "slash@example.com"}, "slashes")
    assert first.status_code == 201
    for path in ("/contacts/",):
        again = await client.post(path, json={"email": "slash@example.com"},
                                  headers={KEY: "slashes"})
        assert (again.status_code, again.headers.get("Idempotent-Replayed")) == (201, "true"), (
            path, again.text
        )
        assert again.content == first.content
    assert await count_contacts(service) == 1


async def test_a_claim_alone_commits_without_waiting_for_the_disk(service: Service) -> None:
    """A claim made outside a transaction commits asynchronously: right after
    it, WAL has been written that is not yet flushed (a synchronous commit
    returns only once its record is on disk). The setting is the claim's
    own: the session, and a transaction after it, commit synchronously."""
    unflushed = 0
    async with service.db.acquire() as conn:
        for attempt in range(5):
            claimed = await records.begin(
                conn, uuid4(), f"quick-{attempt}", b"fingerprint",
                lock_seconds=30, retention_seconds=60,
            )
            assert isinstance(claimed, records.Claimed)
            unflushed += await conn.fetchval(
                "SELECT pg_current_wal_insert_lsn() > pg_current_wal_flush_lsn()"
            )
            assert await conn.fetchval("SHOW synchronous_commit") == "on"
        assert unflushed > 0
        async with conn.transaction():
            inside = await records.begin(
                conn, uuid4(), "in-a-transaction", b"fingerprint",
                lock_seconds=30, retention_seconds=60,
            )
            assert isinstance(inside, records.Claimed)
            assert await conn.fetchval("SHOW synchronous_commit") == "on"
            written = await conn.fetchval("SELECT pg_current_wal_insert_lsn()::text")
        # On disk once the commit returns: WAL is the whole server's, so the
        # claim's own (what was written before its commit) is what is looked
        # at, not whatever other sessions wrote since.
        assert await conn.fetchval(
            "SELECT pg_current_wal_flush_lsn() >= $1::text::pg_lsn", written
        )


async def test_a_retry_whose_handler_would_succeed_again_executes_once(
    client: httpx.AsyncClient, service: Service
) -> None:
    """Segments have no unique name: only the key's record stops the retry."""
    first = await client.post("/segments", json={"name": "again"}, headers={KEY: "seg"})
    assert first.status_code == 201
    for _ in range(2):
        again = await client.post("/segments", json={"name": "again"}, headers={KEY: "seg"})
        assert (again.status_code, again.content) == (201, first.content)
        assert again.headers["Idempotent-Replayed"] == "true"
    async with service.db.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM segments") == 1


async def test_a_retry_the_handler_would_refuse_is_answered_from_the_record(
    client: httpx.AsyncClient, service: Service
) -> None:
    """The contact is gone after the first DELETE, so running the retry
    would say 404: the stored answer is given instead."""
    created = await post(client, {"email": "gone@example.com"}, "make")
    contact = created.json()["data"]["id"]
    first = await client.delete(f"/contacts/{contact}", headers={KEY: "remove"})
    assert first.status_code == 204
    again = await client.delete(f"/contacts/{contact}", headers={KEY: "remove"})
    assert again.status_code == 204
    assert again.headers["Idempotent-Replayed"] == "true"
    # Without the key, or with a new one, the handler answers.
    assert (await client.delete(f"/contacts/{contact}")).status_code == 404
    assert (await client.delete(f"/contacts/{contact}", headers={KEY: "new"})).status_code == 404
    assert await count_contacts(service) == 0


async def test_a_refused_request_leaves_its_key_free(
    client: httpx.AsyncClient, service: Service
) -> None:
    missing = "/contacts/00000000-0000-4000-8000-000000000000"
    assert (await client.delete(missing, headers={KEY: "free"})).status_code == 404
    async with service.db.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM idempotency_keys") == 0


async def test_retries_at_once_of_a_completed_request_all_replay(
    client: httpx.AsyncClient, service: Service
) -> None:
    """A retry runs the handler again (rolled back) before it finds the
    record: retries beside it are answered from the record, not told that
    it is "still processing"."""
    first = await client.post("/segments", json={"name": "burst"}, headers={KEY: "burst"})
    assert first.status_code == 201
    responses: list[httpx.Response] = []

    async def retry() -> None:
        responses.append(
            await client.post("/segments", json={"name": "burst"}, headers={KEY: "burst"})
        )

    async with trio.open_nursery() as nursery:
        for _ in range(10):
            nursery.start_soon(retry)
    assert [(r.status_code, r.headers.get("Idempotent-Replayed")) for r in responses] == [
        (201, "true")
    ] * 10
    assert {r.content for r in responses} == {first.content}


async def test_a_different_request_never_takes_the_key_from_a_running_one(
    database_url: str, acme: Credential
) -> None:
    """Not even once the running attempt outlived its lock: it is told
    "different request" each time, and the first attempt commits."""
    async with custom_service(database_url, acme, idempotency_lock_seconds=1) as (
        service, client
    ):
        async with held_up(
            service, lambda: post(client, {"email": "first@example.com"}, "taken")
        ) as results:
            for pause in (0, 1.2, 0.1):
                await trio.sleep(pause)
                for body in ({"email": "other@example.com"}, {"email": 5}):
                    other = await post(client, body, "taken")
                    assert other.status_code == 409
                    assert "different request" in other.json()["error"]["message"]
        assert results[0].status_code == 201
        assert await count_contacts(service) == 1


async def test_a_retry_stuck_past_its_lock_still_gets_the_completed_answer(
    database_url: str, acme: Credential
) -> None:
    """The DELETE completed; a retry of it is held up past the lock. A second
    retry meanwhile, and the first once it runs (its handler would say 404),
    are both answered from the record."""
    async with custom_service(database_url, acme, idempotency_lock_seconds=1) as (
        service, client
    ):
        segment = (await client.post("/segments", json={"name": "s"})).json()["data"]["id"]
        first = await client.delete(f"/segments/{segment}", headers={KEY: "drop"})
        assert first.status_code == 204
        async with held_up(
            service, lambda: client.delete(f"/segments/{segment}", headers={KEY: "drop"}),
            "segments",
        ) as results:
            await trio.sleep(1.2)
            beside = await client.delete(f"/segments/{segment}", headers={KEY: "drop"})
            assert (beside.status_code, beside.headers.get("Idempotent-Replayed")) == (
                204, "true")
        assert (results[0].status_code, results[0].headers.get("Idempotent-Replayed")) == (
            204, "true")
