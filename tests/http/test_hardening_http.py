"""HTTP conventions that hold under hostile input: 405 Allow, one credential only."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import assert_error


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("PUT", "/contacts", {"GET", "HEAD", "OPTIONS", "POST"}),
        ("DELETE", "/healthz", {"GET", "HEAD", "OPTIONS"}),
        ("POST", "/tokens/00000000-0000-0000-0000-000000000000", {"DELETE", "OPTIONS"}),
    ],
)
async def test_a_405_carries_allow_and_the_envelope(
    client: httpx.AsyncClient, method: str, path: str, allowed: set[str]
) -> None:
    response = await client.request(method, path)
    message = assert_error(response, 405, "BAD_REQUEST")
    assert method in message
    assert {part.strip() for part in response.headers["allow"].split(",")} == allowed
