"""No secret at rest: responses that show a secret are stored sealed for replays."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Credential, MakeToken, assert_error
from tests.http.test_idempotency import custom_service
from tidings.config import Config, SettingError
from tidings.sealing import KEY_FILE, SEALED_PREFIX, load_key
from tidings.service import Service

KEY = "Idempotency-Key"
HOOK = {"url": "http://127.0.0.1:9/hook", "events": ["*"]}


@pytest.fixture
def config(database_url: str) -> Config:
    # Webhook endpoints on loopback: nothing is delivered in these tests.
    return Config(
        database_url=database_url, db_pool_size=4, rate_limit_per_second=0,
        shutdown_grace_seconds=2, webhook_allow_private_urls=True,
    )


async def stored_bodies(service: Service) -> list[bytes]:
    async with service.db.acquire() as conn:
        rows = await conn.fetch("SELECT response_body FROM idempotency_keys")
    return [bytes(row["response_body"]) for row in rows]


def assert_sealed(bodies: list[bytes], secrets: list[str]) -> None:
    assert bodies
    for body in bodies:
        assert body.startswith(SEALED_PREFIX)
        for secret in secrets:
            assert secret.encode() not in body
            # Nor any recognisable part of it.
            assert secret[-16:].encode() not in body
        assert b"svc_team_" not in body and b"whsec_" not in body


async def send(
    http: httpx.AsyncClient, method: str, path: str, credential: Credential, key: str,
    body: Any = None,
) -> httpx.Response:
    return await http.request(
        method, path, json=body, headers={**credential.headers, KEY: key}
    )


async def test_a_new_token_is_stored_sealed_and_replays(
    http: httpx.AsyncClient, make_token: MakeToken, service: Service
) -> None:
    manager = await make_token(step_up=True)
    body = {"permissions": ["contacts:read"]}
    first = await send(http, "POST", "/tokens", manager, "token-1", body)
    assert first.status_code == 201, first.text
    secret = first.json()["data"]["token"]
    assert_sealed(await stored_bodies(service), [secret])

    again = await send(http, "POST", "/tokens", manager, "token-1", body)
    assert again.status_code == 201
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    listed = await http.get("/tokens", headers=manager.headers)
    assert len(listed.json()["data"]["data"]) == 2  # the manager and one new token


async def test_webhook_secrets_are_stored_sealed_and_replay(
    http: httpx.AsyncClient, acme: Credential, service: Service
) -> None:
    created = await send(http, "POST", "/webhook-endpoints", acme, "hook-1", HOOK)
    assert created.status_code == 201, created.text
    endpoint = created.json()["data"]
    path = f"/webhook-endpoints/{endpoint['id']}/rotate-secret"
    rotated = await send(http, "POST", path, acme, "rotate-1")
    assert rotated.status_code == 200, rotated.text
    secrets = [endpoint["secret"], rotated.json()["data"]["secret"]]
    assert_sealed(await stored_bodies(service), secrets)

    for method_path, key, first in (
        ("/webhook-endpoints", "hook-1", created), (path, "rotate-1", rotated)
    ):
        replay = await send(
            http, "POST", method_path, acme, key, HOOK if key == "hook-1" else None
        )
        assert replay.content == first.content
        assert replay.headers["Idempotent-Replayed"] == "true"


async def test_another_key_cannot_replay_a_secret_and_says_so(
    database_url: str, make_token: MakeToken
) -> None:
    manager = await make_token(step_up=True)
    body = {"permissions": ["contacts:read"]}
    shared = os.urandom(32)
    async with custom_service(database_url, manager, secret_key=shared) as (_, client):
        first = await client.post("/tokens", json=body, headers={KEY: "token-2"})
        assert first.status_code == 201, first.text
    # Another process with the same TIDINGS_SECRET_KEY replays.
    async with custom_service(database_url, manager, secret_key=shared) as (_, client):
        again = await client.post("/tokens", json=body, headers={KEY: "token-2"})
        assert again.content == first.content
    # One with another key refuses, and runs nothing.
    async with custom_service(database_url, manager) as (service, client):
        refused = await client.post("/tokens", json=body, headers={KEY: "token-2"})
        message = assert_error(refused, 409, "CONFLICT")
        assert "secret" in message and "TIDINGS_SECRET_KEY" in message
        async with service.db.acquire() as conn:
            assert await conn.fetchval("SELECT count(*) FROM api_tokens") == 2


async def test_ordinary_responses_stay_plain(
    client: httpx.AsyncClient, service: Service
) -> None:
    response = await client.post(
        "/contacts", json={"email": "plain@example.com"}, headers={KEY: "plain-1"}
    )
    assert response.status_code == 201
    assert await stored_bodies(service) == [response.content]


def test_the_key_lives_in_the_data_dir_of_an_embedded_database(tmp_path: Path) -> None:
    config = Config(data_dir=tmp_path / "data")
    key = load_key(config)
    assert len(key) == 32
    assert load_key(config) == key
    path = tmp_path / "data" / KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == [KEY_FILE]
    # With a database elsewhere and no setting: a key of this process alone.
    elsewhere = Config(database_url="postgresql://db/x", data_dir=tmp_path / "other")
    assert load_key(elsewhere) != load_key(elsewhere)
    assert not (tmp_path / "other").exists()


def test_the_secret_key_setting() -> None:
    raw = bytes(range(32))
    assert Config.from_env({"TIDINGS_SECRET_KEY": raw.hex()}).secret_key == raw
    import base64

    for encoded in (base64.b64encode(raw), base64.urlsafe_b64encode(raw).rstrip(b"=")):
        assert Config.from_env({"TIDINGS_SECRET_KEY": encoded.decode()}).secret_key == raw
    for bad in ("short", "zz" * 32, base64.b64encode(b"x" * 16).decode()):
        with pytest.raises(SettingError, match="TIDINGS_SECRET_KEY"):
            Config.from_env({"TIDINGS_SECRET_KEY": bad})
    assert "secret_key" not in repr(Config(secret_key=raw))


async def test_migration_0007_deletes_plain_secrets(service: Service) -> None:
    from tidings.storage.migrate import load_migrations

    (sql,) = [m.sql for m in load_migrations() if m.version == 7]
    insert = """
    INSERT INTO idempotency_keys (scope, key, fingerprint, claim, status, locked_until,
                                  expires_at, response_status, response_body)
    VALUES (gen_random_uuid(), $1, '\\x00', gen_random_uuid(), 'completed', now(),
            now() + interval '1 day', 201, $2)
    """
    async with service.db.acquire() as conn:
        for key, body in (("a", b'{"token":"svc_team_x"}'), ("b", b'{"secret":"whsec_y"}'),
                          ("c", b'{"id":"plain"}'), ("d", SEALED_PREFIX + b"\x01")):
            await conn.execute(insert, key, body)
        await conn.execute(sql)
        left = await conn.fetch("SELECT key FROM idempotency_keys ORDER BY key")
    assert [row["key"] for row in left] == ["c", "d"]
