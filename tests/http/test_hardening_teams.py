"""Team names: what ``tidings tokens create --team`` accepts."""

from __future__ import annotations

import json

import pytest

from tests.http.test_tokens import tidings_cli
from tidings.service import Service
from tidings.storage import tokens as token_store


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("", "empty"),
        (" \t ", "empty"),
        ("x" * 101, "at most 100"),
    ],
)
async def test_cli_refuses_a_bad_team_name(
    database_url: str, service: Service, name: str, reason: str
) -> None:
    done = await tidings_cli(database_url, "tokens", "create", "--team", name, check=False)
    assert done.returncode == 1
    assert done.stdout == b""
    errors = done.stderr.decode().strip().splitlines()
    assert len(errors) == 1, done.stderr
    assert errors[0].startswith("tidings: --team: ") and reason in errors[0]
    async with service.db.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM teams") == 0


async def test_a_team_name_is_trimmed(database_url: str, service: Service) -> None:
    first = json.loads((await tidings_cli(
        database_url, "tokens", "create", "--team", "  Acme Inc. \u00e9 "
    )).stdout)
    second = json.loads((await tidings_cli(
        database_url, "tokens", "create", "--team", "Acme Inc. \u00e9"
    )).stdout)
    assert first["team_id"] == second["team_id"]
    async with service.db.acquire() as conn:
        assert await conn.fetchval("SELECT name FROM teams") == "Acme Inc. \u00e9"


async def test_storage_refuses_an_empty_team_name(service: Service) -> None:
    async with service.db.acquire() as conn:
        with pytest.raises(ValueError, match="empty"):
            await token_store.ensure_team(conn, " ")
        assert await conn.fetchval("SELECT count(*) FROM teams") == 0
    assert token_store.check_team_name("x" * 100) == "x" * 100
    for hidden in ("ac\nme", "ac\u200bme", "ac\x00me"):
        with pytest.raises(ValueError, match="control"):
            token_store.check_team_name(hidden)
