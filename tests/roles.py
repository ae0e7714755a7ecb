"""Roles of the test database server: a role that logs in, made for a test."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit, urlunsplit

import triopg


def url_as(database_url: str, role: str) -> str:
    """``database_url`` with ``role`` as its user, without a password (the
    test server trusts its local connections)."""
    parts = urlsplit(database_url)
    host = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=f"{role}@{host}"))


@asynccontextmanager
async def login_role(
    database_url: str, prefix: str, *, connection_limit: int | None = None
) -> AsyncIterator[tuple[str, str]]:
    """A new role that may log in (with a CONNECTION LIMIT if given): its
    name and a URL of the database as it; dropped after, with its grants."""
    role = f"{prefix}_{uuid.uuid4().hex[:12]}"
    limit = "" if connection_limit is None else f" CONNECTION LIMIT {connection_limit}"
    async with triopg.connect(database_url) as conn:
        await conn.execute(f'CREATE ROLE "{role}" LOGIN{limit}')
    try:
        yield role, url_as(database_url, role)
    finally:
        async with triopg.connect(database_url) as conn:
            await conn.execute(f'DROP OWNED BY "{role}"')
            await conn.execute(f'DROP ROLE "{role}"')
