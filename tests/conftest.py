"""Fixtures: a real PostgreSQL, a fresh database per test, the real service over HTTP.

Every response that the ``http`` and ``client`` fixtures receive is checked
against the OpenAPI document (tests/openapi_check.py): a response the
document does not describe fails the test.

With DATABASE_URL set the tests use that server (they create and drop their
own databases on it); otherwise one embedded PostgreSQL serves the session.
Each test gets a database cloned from a migrated template, so tests never
see each other's rows.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import triopg

from tests.db_proxy import DatabaseProxy
from tests.openapi_check import check_hook
from tidings.app import serve_http
from tidings.config import Config
from tidings.permissions import ALL_PERMISSIONS
from tidings.service import Service, open_service
from tidings.storage import tokens as token_store
from tidings.storage.db import open_asyncio_bridge, with_database
from tidings.storage.embedded import start_embedded
from tidings.storage.migrate import migrate

TEMPLATE = f"tidings_template_{os.getpid()}"


async def _prepare_template(admin_url: str) -> None:
    async with open_asyncio_bridge():
        async with triopg.connect(admin_url) as conn:
            await conn.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}"')
            await conn.execute(f'CREATE DATABASE "{TEMPLATE}"')
        async with triopg.connect(with_database(admin_url, TEMPLATE)) as conn:
            await migrate(conn)


async def _drop_template(admin_url: str) -> None:
    async with open_asyncio_bridge(), triopg.connect(admin_url) as conn:
        await conn.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}"')


@pytest.fixture(scope="session")
def pg_admin_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A URL to a database with the right to CREATE DATABASE."""
    url = os.environ.get("DATABASE_URL")
    if url:
        return url
    return start_embedded(Path(tmp_path_factory.mktemp("embedded")))


@pytest.fixture(scope="session")
def pg_template(pg_admin_url: str) -> Any:
    trio.run(_prepare_template, pg_admin_url)
    yield TEMPLATE
    trio.run(_drop_template, pg_admin_url)


@pytest.fixture
async def asyncio_bridge() -> AsyncIterator[None]:
    async with open_asyncio_bridge():
        yield


@asynccontextmanager
async def fresh_database(admin_url: str, template: str | None = None) -> AsyncIterator[str]:
    """A new database (a copy of ``template``, or empty) for one test; dropped after."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    copy = f' TEMPLATE "{template}"' if template else ""
    async with triopg.connect(admin_url) as conn:
        await conn.execute(f'CREATE DATABASE "{name}"{copy}')
    try:
        yield with_database(admin_url, name)
    finally:
        with trio.CancelScope(shield=True):
            async with triopg.connect(admin_url) as conn:
                await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def database_url(
    pg_admin_url: str, pg_template: str, asyncio_bridge: None
) -> AsyncIterator[str]:
    async with fresh_database(pg_admin_url, pg_template) as url:
        yield url


@pytest.fixture
async def proxy(database_url: str, nursery: trio.Nursery) -> DatabaseProxy:
    """A proxy to the test's database that the test can cut and restore; a
    module points its ``config`` at ``proxy.url``."""
    proxy = DatabaseProxy(database_url)
    await nursery.start(proxy.serve)
    return proxy


@pytest.fixture
def config(database_url: str) -> Config:
    return Config(
        database_url=database_url,
        db_pool_size=4,
        rate_limit_per_second=0,
        shutdown_grace_seconds=2,
    )


@pytest.fixture
async def service(config: Config) -> AsyncIterator[Service]:
    async with open_service(config) as running:
        yield running


@pytest.fixture
async def base_url(service: Service, nursery: trio.Nursery) -> str:
    binds: list[str] = await nursery.start(serve_http, service, "127.0.0.1", 0)
    return binds[0]


@pytest.fixture
async def http(base_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the running service, without credentials."""
    async with httpx.AsyncClient(
        base_url=base_url, timeout=30, event_hooks={"response": [check_hook]}
    ) as client:
        yield client


@dataclass(frozen=True)
class Credential:
    team_id: uuid.UUID
    token_id: uuid.UUID
    secret: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secret}"}


MakeToken = Callable[..., Awaitable[Credential]]


@pytest.fixture
def make_token(service: Service) -> MakeToken:
    """``await make_token(team="acme", permissions=[...], expires_in=..., step_up=...)``."""

    async def make(
        team: str = "acme",
        permissions: list[str] | tuple[str, ...] = ALL_PERMISSIONS,
        expires_in: float | None = None,
        step_up: bool = False,
    ) -> Credential:
        async with service.db.transaction() as conn:
            team_id = await token_store.ensure_team(conn, team)
            token, secret = await token_store.create_token(
                conn, team_id, permissions, expires_in=expires_in, step_up=step_up
            )
        return Credential(team_id, token.id, secret)

    return make


@pytest.fixture
async def acme(make_token: MakeToken) -> Credential:
    return await make_token(team="acme")


@pytest.fixture
async def client(
    base_url: str, acme: Credential
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the running service with a token of team acme holding every permission."""
    async with httpx.AsyncClient(
        base_url=base_url, headers=acme.headers, timeout=30,
        event_hooks={"response": [check_hook]},
    ) as c:
        yield c


def assert_error(response: httpx.Response, status: int, code: str) -> str:
    """The response is exactly the error envelope with ``status`` and ``code``; its message."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json"), response.headers
    assert "<html" not in response.text.lower()
    body = response.json()
    assert set(body) == {"success", "error"}, body
    assert body["success"] is False
    assert set(body["error"]) == {"code", "message"}, body
    assert body["error"]["code"] == code, body
    message = body["error"]["message"]
    assert isinstance(message, str) and message
    return message
