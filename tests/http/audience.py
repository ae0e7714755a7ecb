"""Helpers shared by the audience tests."""

from __future__ import annotations

import os
import sys
from typing import Any

import httpx
import trio


def ok(response: httpx.Response, status: int = 200) -> Any:
    """The ``data`` of a success with ``status`` (None for a 204)."""
    assert response.status_code == status, response.text
    if status == 204:
        assert response.content == b""
        return None
    body = response.json()
    assert body["success"] is True, body
    return body["data"]


async def create(client: httpx.AsyncClient, **fields: Any) -> dict[str, Any]:
    """A new contact."""
    data: dict[str, Any] = ok(await client.post("/contacts", json=fields), 201)
    return data


async def define(client: httpx.AsyncClient, **fields: Any) -> dict[str, Any]:
    """A new contact property definition."""
    data: dict[str, Any] = ok(await client.post("/contact-properties", json=fields), 201)
    return data


async def make(client: httpx.AsyncClient, path: str, **fields: Any) -> dict[str, Any]:
    """POST ``fields`` to ``path``, expecting 201."""
    data: dict[str, Any] = ok(await client.post(path, json=fields), 201)
    return data


async def tidings(*args: str) -> Any:
    """Run the ``tidings`` command line (``python -m tidings``) with ``args``."""
    return await trio.run_process(
        [sys.executable, "-m", "tidings", *args],
        capture_stdout=True, capture_stderr=True, check=False,
        env={**os.environ, "TIDINGS_LOG_LEVEL": "WARNING"},
    )
