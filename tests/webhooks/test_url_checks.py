"""Endpoint URLs: what is refused before any lookup, and how many names one
team may have resolving at once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
import trio

from tests.conftest import assert_error
from tests.webhooks.conftest import FAST
from tidings.app import serve_http
from tidings.config import Config
from tidings.permissions import ALL_PERMISSIONS
from tidings.service import open_service
from tidings.storage import tokens as token_store
from tidings.webhooks.client import UnsupportedUrl, parse_target
from tidings.webhooks.safety import CHECKS_PER_TEAM
from tidings.webhooks.urls import check_url

PUBLIC = "93.184.215.14"


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:0/zero",
        "https://93.184.215.14:0/",
        "http://exa\x01mple.com/",
        "http://1.1.1.1/\x01x",
        "http://1.1.1.1/\x7f",
        "http://1.1.1.1/a?b=\x00",
        "http://1.1.1.1/\x1f",
        "http://-bad-.com/",
        "http://bad-.example.com/",
        "http://exa_mple.com/",
        "http://" + "a." * 126 + "com/",  # 255 characters
        "http://" + "a" * 64 + ".com/",
        "http://%31%32%37.0.0.1/",
        "http://exa%6dple.com/",
        "http://xn--zz.com/",
        "http://exa*mple.com/",
        "http://[fe80::1%25eth0]/",
    ],
)
async def test_invalid_urls_are_400_naming_url(client: httpx.AsyncClient, url: str) -> None:
    message = assert_error(
        await client.post("/webhook-endpoints", json={"url": url, "events": ["*"]}),
        400, "BAD_REQUEST",
    )
    assert "url" in message
    created = await client.post(
        "/webhook-endpoints", json={"url": f"https://{PUBLIC}/", "events": ["*"]}
    )
    path = f"/webhook-endpoints/{created.json()['data']['id']}"
    message = assert_error(await client.patch(path, json={"url": url}), 400, "BAD_REQUEST")
    assert "url" in message


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com/hook",
        "https://example.com./hook",
        "https://EXAMPLE.com:443/a?b=%20#part",
        "https://r3---sn-abc.googlevideo.com/",
        "https://xn--bcher-kva.example/",
        "https://" + "a" * 63 + ".example.com/",
        "https://" + "a." * 125 + "co/",  # 253 characters
        "http://[2001:db8::1]:8080/hook",
        "http://93.184.215.14:65535/",
        "https://example.com/path%7Fencoded",
    ],
)
def test_valid_urls_pass(url: str) -> None:
    assert check_url(url) == url


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:0/", "http://1.1.1.1/\x01x", "http://1.1.1.1/\x7f"]
)
def test_delivery_refuses_urls_stored_before_they_were_checked(url: str) -> None:
    with pytest.raises(UnsupportedUrl):
        parse_target(url)


@asynccontextmanager
async def two_teams(
    database_url: str, gate: trio.Event, resolving: list[str]
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    """A service whose names resolve once ``gate`` is set, and a client of
    each of two teams."""

    async def resolve(host: str, port: int) -> list[str]:
        resolving.append(host)
        await gate.wait()
        return [PUBLIC]

    config = Config(
        database_url=database_url, db_pool_size=6, rate_limit_per_second=0,
        shutdown_grace_seconds=2, **{**FAST, "webhook_allow_private_urls": False},
    )
    async with open_service(config, resolve=resolve) as service, trio.open_nursery() as nursery:
        secrets = []
        for team in ("acme", "globex"):
            async with service.db.transaction() as conn:
                team_id = await token_store.ensure_team(conn, team)
                _token, secret = await token_store.create_token(conn, team_id, ALL_PERMISSIONS)
            secrets.append(secret)
        binds = await nursery.start(serve_http, service, "127.0.0.1", 0)
        async with (
            httpx.AsyncClient(
                base_url=binds[0], headers={"Authorization": f"Bearer {secrets[0]}"}, timeout=30
            ) as acme,
            httpx.AsyncClient(
                base_url=binds[0], headers={"Authorization": f"Bearer {secrets[1]}"}, timeout=30
            ) as globex,
        ):
            yield acme, globex
        nursery.cancel_scope.cancel()


async def test_slow_names_of_one_team_leave_the_server_to_the_others(
    database_url: str,
) -> None:
    """More creates with slowly resolving names than the pool and its queue
    hold: the team gets 429 beyond its share, never the others a 503."""
    gate = trio.Event()
    resolving: list[str] = []
    creates = 20  # more than the pool (6) and its waiters (10) together
    async with two_teams(database_url, gate, resolving) as (acme, globex):
        literal = (await acme.post(
            "/webhook-endpoints", json={"url": f"https://{PUBLIC}/", "events": ["*"]}
        )).json()["data"]
        answers: dict[int, httpx.Response] = {}

        async def create(n: int) -> None:
            answers[n] = await acme.post(
                "/webhook-endpoints", json={"url": f"https://slow{n}.example.com/", "events": ["*"]}
            )

        async with trio.open_nursery() as nursery:
            for n in range(creates):
                nursery.start_soon(create, n)
                await trio.sleep(0.005)
            with trio.fail_after(5):
                while len(resolving) < CHECKS_PER_TEAM:
                    await trio.sleep(0.02)
            await trio.sleep(0.3)  # the other creates arrive (and are answered, or wait)
            # The other team is served at once, on both sides of the server
            # (the names stay unresolved until the gate opens: a request
            # waiting for them would wait past any bound; 5 s is for a
            # loaded machine).
            with trio.fail_after(5):
                for path in ("/contacts", "/webhook-endpoints", "/events"):
                    response = await globex.get(path)
                    assert response.status_code == 200, (path, response.text)
            # The team itself: an address literal needs no lookup, a third name waits for none.
            with trio.fail_after(5):
                other = await acme.post(
                    "/webhook-endpoints", json={"url": f"http://{PUBLIC}/x", "events": ["*"]}
                )
                assert other.status_code == 201, other.text
                busy = await acme.patch(
                    f"/webhook-endpoints/{literal['id']}", json={"url": "https://busy.example.com/"}
                )
            assert "url" in assert_error(busy, 429, "TOO_MANY_REQUESTS")
            assert busy.headers["retry-after"] == "1"
            assert len(resolving) == CHECKS_PER_TEAM
            gate.set()
        statuses = [response.status_code for response in answers.values()]
        assert statuses.count(201) == CHECKS_PER_TEAM
        # The rest were told to retry: most for the team's share, a few perhaps
        # because twenty arrived at once, more than a process takes.
        assert statuses.count(429) + statuses.count(503) == creates - CHECKS_PER_TEAM
        for response in answers.values():
            if response.status_code == 429:
                assert "url" in assert_error(response, 429, "TOO_MANY_REQUESTS")
                assert response.headers["retry-after"] == "1"

        # Told to retry, every create succeeds.
        with trio.fail_after(20):
            for n, response in answers.items():
                while response.status_code in (429, 503):
                    await trio.sleep(0.01)
                    await create(n)
                    response = answers[n]
                assert response.status_code == 201, response.text
        listed = (await acme.get("/webhook-endpoints", params={"limit": 100})).json()["data"]
        assert len(listed["data"]) == creates + 2
