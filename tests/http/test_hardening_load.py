"""Probes and load shedding: what a process answers when its pool and its slots are full."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

from tests.conftest import Credential, MakeToken, assert_error
from tidings.config import Config
from tidings.http.app import create_app
from tidings.http.shedding import Shedder
from tidings.http.system import Readiness
from tidings.service import Service, open_service
from tidings.storage.connection import AsyncioConnection

# A probe must answer well within this, whatever else the process is doing.
PROBE_SECONDS = 1.5


HOLD_KEY = 7_654_321


async def _wait_for_lock(conn: AsyncioConnection) -> None:
    await conn.fetchval("SELECT pg_advisory_lock_shared($1)", HOLD_KEY)
    await conn.fetchval("SELECT pg_advisory_unlock_shared($1)", HOLD_KEY)


@asynccontextmanager
async def held_pool(service: Service) -> AsyncIterator[None]:
    """Every pooled connection taken, so any request that needs one waits:
    those of the trio-side pool held open, and those of the storage units'
    pool each in a unit waiting in PostgreSQL for an advisory lock."""
    size = service.config.db_pool_size
    held = 0
    release = trio.Event()

    async def hold() -> None:
        nonlocal held
        async with service.db.acquire():
            held += 1
            await release.wait()

    async with service.db.acquire() as locker:
        await locker.fetchval("SELECT pg_advisory_lock($1)", HOLD_KEY)
        try:
            async with trio.open_nursery() as nursery:
                for _ in range(size):
                    nursery.start_soon(service.db.run, _wait_for_lock)
                await wait_for_locked(service, size)
                # The locker is one of the trio side's: hold the others.
                for _ in range(size - 1):
                    nursery.start_soon(hold)
                await wait_for(lambda: held == size - 1)
                try:
                    yield
                finally:
                    release.set()
                    await locker.fetchval("SELECT pg_advisory_unlock($1)", HOLD_KEY)
        finally:
            await locker.fetchval("SELECT pg_advisory_unlock_all()")


async def wait_for_locked(service: Service, count: int) -> None:
    """Until ``count`` sessions wait for the hold lock."""
    with trio.fail_after(10):
        async with service.db.acquire() as conn:
            while await conn.fetchval(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                " AND objid = $1::bigint", HOLD_KEY,
            ) < count:
                await trio.sleep(0.01)


async def test_the_probes_answer_while_the_pool_is_held(
    http: httpx.AsyncClient, service: Service
) -> None:
    async with held_pool(service):
        with trio.fail_after(PROBE_SECONDS):
            healthy = await http.get("/healthz")
            live = await http.get("/livez")
            ready = await http.get("/readyz")
    assert healthy.status_code == 200, healthy.text
    assert healthy.json() == {"success": True, "data": {"status": "ok"}}
    assert live.json() == {"success": True, "data": {"status": "alive"}}
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
    # Storage is up: healthy (CONTRACT §2), and alive.
    assert (await http.get("/healthz")).status_code == 200
    assert (await http.get("/livez")).status_code == 200


async def test_readiness_of_unreachable_storage(asyncio_bridge: None) -> None:
    readiness = Readiness("postgresql://nobody@127.0.0.1:1/nothing")
    with trio.fail_after(5):
        assert await readiness.problem() == "storage is unreachable"


# --- shedding -------------------------------------------------------------------


@asynccontextmanager
async def shedding_service(
    database_url: str, credential: Credential, **settings: Any
) -> AsyncIterator[tuple[Service, Shedder, httpx.AsyncClient]]:
    """The service served with its app at hand, to watch its shedder."""
    config = Config(
        database_url=database_url, rate_limit_per_second=0, shutdown_grace_seconds=2,
        **settings,
    )
    async with open_service(config) as service, trio.open_nursery() as nursery:
        app = create_app(service)
        shedder = app.asgi_app
        assert isinstance(shedder, Shedder)
        http_config = HypercornConfig()
        http_config.bind = ["127.0.0.1:0"]
        http_config.accesslog = None
        http_config.errorlog = logging.getLogger("hypercorn.error")
        binds = await nursery.start(
            lambda task_status: hypercorn_serve(
                app, http_config, shutdown_trigger=trio.sleep_forever,  # type: ignore[arg-type]
                task_status=task_status,
            )
        )
        async with httpx.AsyncClient(
            base_url=binds[0], headers=credential.headers, timeout=30
        ) as client:
            yield service, shedder, client
        nursery.cancel_scope.cancel()


async def wait_for(condition: Any) -> None:
    with trio.fail_after(10):
        while not condition():
            await trio.sleep(0.01)


async def test_requests_beyond_the_storage_bound_are_shed_at_once(
    database_url: str, acme: Credential, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tidings.access")
    async with shedding_service(
        database_url, acme, db_pool_size=2, max_db_waiters=1, max_in_flight=50
    ) as (service, shedder, client):
        waiting: list[httpx.Response] = []

        async def wait_in_line() -> None:
            waiting.append(await client.get("/contacts"))

        async with trio.open_nursery() as nursery:
            async with held_pool(service):
                for _ in range(3):  # the pool's 2 and 1 waiter
                    nursery.start_soon(wait_in_line)
                await wait_for(lambda: shedder.storage_in_flight == 3)
                with trio.fail_after(PROBE_SECONDS):
                    shed = await client.get("/contacts", headers={"X-Request-Id": "mine-1"})
                    live = await client.get("/healthz")
                    ready = await client.get("/readyz")
                    metrics = await client.get("/metrics")
                message = assert_error(shed, 503, "SERVICE_UNAVAILABLE")
                assert "capacity" in message
                assert shed.headers["retry-after"] == "1"
                assert shed.headers["connection"] == "close"
                assert shed.headers["x-request-id"] == "mine-1"  # as every response
                # And its access line, as every request's.
                [line] = [r for r in caplog.records if r.name == "tidings.access"
                          and getattr(r, "request_id", None) == "mine-1"]
                assert (line.route, line.status) == ("(shed)", 503)  # type: ignore[attr-defined]
                assert (live.status_code, ready.status_code, metrics.status_code) == (
                    200, 200, 200
                )
                assert 'route="(shed)",status="503"' in metrics.text
            # The pool is free: the waiting requests are answered.
        assert [r.status_code for r in waiting] == [200, 200, 200]
        # Counted out once their handlers return, just after the answers left.
        await wait_for(lambda: shedder.in_flight == 0 and shedder.storage_in_flight == 0)
        assert (await client.get("/contacts")).status_code == 200


async def test_a_get_counts_against_storage_whatever_body_it_announces(
    database_url: str, acme: Credential
) -> None:
    """A GET is served without waiting for a body it announces: it takes its
    storage place at once, as one without a body does, so the bound holds."""
    async with shedding_service(
        database_url, acme, db_pool_size=2, max_db_waiters=1, max_in_flight=50
    ) as (service, shedder, client):
        host, port = client.base_url.host, client.base_url.port
        assert port is not None
        streams: list[trio.SocketStream] = []
        async with held_pool(service):
            for _ in range(3):  # the pool's 2 and 1 waiter, each announcing a body
                stream = await trio.open_tcp_stream(host, port)
                await stream.send_all(
                    f"GET /contacts HTTP/1.1\r\nHost: {host}\r\nAuthorization: "
                    f"Bearer {acme.secret}\r\nContent-Length: 5\r\n\r\n".encode()
                )
                streams.append(stream)
            await wait_for(lambda: shedder.in_flight == 3)
            assert shedder.storage_in_flight == 3
            with trio.fail_after(PROBE_SECONDS):
                shed = await client.get("/contacts")
            assert_error(shed, 503, "SERVICE_UNAVAILABLE")
        for stream in streams:
            with trio.fail_after(10):
                assert (await stream.receive_some(65536)).startswith(b"HTTP/1.1 200 ")
            await stream.aclose()


async def test_requests_beyond_the_in_flight_bound_are_shed(
    database_url: str, acme: Credential
) -> None:
    async with shedding_service(
        database_url, acme, db_pool_size=2, max_db_waiters=10, max_in_flight=2
    ) as (service, shedder, client):
        async with trio.open_nursery() as nursery:
            async with held_pool(service):
                for _ in range(2):
                    nursery.start_soon(client.get, "/contacts")
                await wait_for(lambda: shedder.in_flight == 2)
                with trio.fail_after(PROBE_SECONDS):
                    # Even a route without storage is shed; the probes and
                    # the metrics are not.
                    assert_error(await client.get("/openapi.json"), 503, "SERVICE_UNAVAILABLE")
                    assert (await client.get("/healthz")).status_code == 200
                    assert (await client.get("/readyz")).status_code == 200
                    assert (await client.get("/metrics")).status_code == 200
        assert shedder.shed_total == 1


def test_shedding_settings() -> None:
    config = Config.from_env({"TIDINGS_MAX_IN_FLIGHT": "7", "TIDINGS_MAX_DB_WAITERS": "0"})
    assert (config.max_in_flight, config.max_db_waiters) == (7, 0)
    assert (Config().max_in_flight, Config().max_db_waiters) == (64, 10)


async def _slow_upload(
    host: str, port: int, secret: str, started: trio.Event, path: str = "/contacts"
) -> None:
    """A POST whose body never arrives past its first byte."""
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        await stream.send_all(
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {secret}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{".encode()
        )
        started.set()
        await trio.sleep_forever()


async def test_slow_request_bodies_take_no_place_in_the_queue_for_storage(
    database_url: str, acme: Credential
) -> None:
    """Bodies that trickle in hold places among the requests in flight, not
    in front of the pool: the other requests are served meanwhile."""
    async with shedding_service(
        database_url, acme, db_pool_size=2, max_db_waiters=1, max_in_flight=50
    ) as (service, shedder, client):
        host, port = client.base_url.host, client.base_url.port
        assert port is not None
        async with trio.open_nursery() as nursery:
            for _ in range(6):  # twice the storage bound of 3
                started = trio.Event()
                nursery.start_soon(_slow_upload, host, port, acme.secret, started)
                await started.wait()
            await wait_for(lambda: shedder.in_flight == 6)
            assert shedder.storage_in_flight == 0
            with trio.fail_after(PROBE_SECONDS):
                listed = await client.get("/contacts")
                created = await client.post("/contacts", json={"email": "ok@example.com"})
            assert (listed.status_code, created.status_code) == (200, 201), created.text
            nursery.cancel_scope.cancel()
        await wait_for(lambda: shedder.in_flight == 0 and shedder.storage_in_flight == 0)


async def test_one_team_holds_at_most_half_the_places_with_bodies_still_arriving(
    database_url: str, acme: Credential, make_token: MakeToken
) -> None:
    """A team's slow uploads beyond half of TIDINGS_MAX_IN_FLIGHT are refused
    429 before their body is read, on routes of the front door and of Quart
    alike; the other teams keep the rest of the places."""
    other = await make_token(team="other")
    async with shedding_service(
        database_url, acme, db_pool_size=2, max_db_waiters=4, max_in_flight=8
    ) as (service, shedder, client):
        host, port = client.base_url.host, client.base_url.port
        assert port is not None
        async with trio.open_nursery() as nursery:
            for path in ("/contacts", "/contacts", "/contacts", "/broadcasts"):  # 8 // 2
                started = trio.Event()
                nursery.start_soon(_slow_upload, host, port, acme.secret, started, path)
                await started.wait()
            # Each admitted (its token looked up) and receiving its body.
            uploads = shedder.app._limiter.uploads  # type: ignore[attr-defined]
            await wait_for(lambda: uploads.count(acme.team_id) == 4)
            with trio.fail_after(PROBE_SECONDS):
                refused = [await client.post(path, json={"email": "late@example.com"})
                           for path in ("/contacts", "/broadcasts")]
                theirs = await client.post("/contacts", json={"email": "ok@example.com"},
                                           headers=other.headers)
            for response in refused:
                assert "sending their bodies" in assert_error(response, 429, "TOO_MANY_REQUESTS")
                assert response.headers["retry-after"] == "1"
            assert theirs.status_code == 201, theirs.text
            nursery.cancel_scope.cancel()
        await wait_for(lambda: shedder.in_flight == 0)
        created = await client.post("/contacts", json={"email": "later@example.com"})
        assert created.status_code == 201, created.text


async def test_content_length_with_transfer_encoding_is_400_and_closes(
    database_url: str, acme: Credential
) -> None:
    """Framed one way by a proxy and the other way here, such a body could
    carry a second request: it is refused, and nothing after it is read."""
    async with shedding_service(database_url, acme, db_pool_size=2) as (service, _, client):
        host, port = client.base_url.host, client.base_url.port
        assert port is not None
        body = b'{"email": "smuggled@example.com"}'
        ambiguous = (
            f"POST /contacts HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {acme.secret}\r\n"
            "Content-Type: application/json\r\nContent-Length: 3\r\n"
            "Transfer-Encoding: chunked\r\n\r\n"
        ).encode() + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
        hidden = (
            f"DELETE /contacts/smuggled@example.com HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: Bearer {acme.secret}\r\n\r\n"
        ).encode()
        probe = (
            f"POST /healthz HTTP/1.1\r\nHost: {host}\r\nContent-Length: 5\r\n"
            "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        ).encode()
        for sent in (ambiguous, ambiguous + hidden, probe + hidden):
            stream = await trio.open_tcp_stream(host, port)
            received = b""
            with trio.fail_after(PROBE_SECONDS):
                async with stream:
                    await stream.send_all(sent)
                    while chunk := await stream.receive_some(65536):
                        received += chunk
            # Refused, then closed: what followed the body is never answered.
            assert received.startswith(b"HTTP/1.1 400"), received
            assert b"Content-Length and Transfer-Encoding" in received
            assert re.search(rb"\r\nx-request-id: [0-9a-f]{32}\r\n", received), received
            assert received.count(b"HTTP/1.1 ") == 1, received
        assert ok_count(await client.get("/contacts")) == 0


def ok_count(response: httpx.Response) -> int:
    assert response.status_code == 200, response.text
    return len(response.json()["data"]["data"])
