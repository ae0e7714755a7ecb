"""Authentication, permissions, token management over HTTP and the CLI."""

from __future__ import annotations

import json
import os
import sys
import uuid
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import httpx
import trio

from tests.conftest import Credential, MakeToken, assert_error
from tidings.service import Service
from tidings.storage import tokens as token_store
from tidings.storage.tokens import TOKEN_PREFIX

MISSING_CONTACT = f"/contacts/{uuid.uuid4()}"




def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


async def assert_works(http: httpx.AsyncClient, headers: dict[str, str]) -> None:
    """The credential is accepted (a missing contact: 404, not 401/403)."""
    response = await http.get(MISSING_CONTACT, headers=headers)
    assert_error(response, 404, "NOT_FOUND")


async def tidings_cli(database_url: str, *args: str, check: bool = True) -> Any:
    env = {**os.environ, "DATABASE_URL": database_url}
    return await trio.run_process(
        [sys.executable, "-m", "tidings", *args],
        capture_stdout=True,
        capture_stderr=True,
        env=env,
        check=check,
    )


# --- 401 ---------------------------------------------------------------------------


async def test_missing_or_malformed_credentials_are_401(
    http: httpx.AsyncClient, acme: Credential
) -> None:
    assert_error(await http.get(MISSING_CONTACT), 401, "UNAUTHORIZED")
    attempts = [
        {"Authorization": ""},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer garbage"},
        {"Authorization": "garbage"},
        {"Authorization": f"Basic {acme.secret}"},
        {"Authorization": f"Token {acme.secret}"},
        {"Authorization": f"Bearer {TOKEN_PREFIX}{'A' * 43}"},
        {"Authorization": f"Bearer {acme.secret[:-1]}"},
    ]
    for headers in attempts:
        assert_error(await http.get(MISSING_CONTACT, headers=headers), 401, "UNAUTHORIZED")
        assert_error(
            await http.post("/contacts", json={"email": "x@example.com"}, headers=headers),
            401,
            "UNAUTHORIZED",
        )
    # The real one, for contrast.
    await assert_works(http, acme.headers)


async def test_expired_token_is_401(http: httpx.AsyncClient, make_token: MakeToken) -> None:
    token = await make_token(expires_in=1)
    await assert_works(http, token.headers)
    await trio.sleep(1.2)
    message = assert_error(
        await http.get(MISSING_CONTACT, headers=token.headers), 401, "UNAUTHORIZED"
    )
    assert "expired" in message


async def test_token_revoked_over_http_is_401(
    http: httpx.AsyncClient, make_token: MakeToken
) -> None:
    manager = await make_token(permissions=["tokens:manage"], step_up=True)
    victim = await make_token(permissions=["contacts:read"])
    await assert_works(http, victim.headers)
    revoked = await http.delete(f"/tokens/{victim.token_id}", headers=manager.headers)
    assert revoked.status_code == 204, revoked.text
    message = assert_error(
        await http.get(MISSING_CONTACT, headers=victim.headers), 401, "UNAUTHORIZED"
    )
    assert "revoked" in message


async def test_token_revoked_by_the_cli_is_401(
    http: httpx.AsyncClient, make_token: MakeToken, database_url: str
) -> None:
    victim = await make_token(permissions=["contacts:read"])
    bystander = await make_token(permissions=["contacts:read"])
    await assert_works(http, victim.headers)
    done = await tidings_cli(database_url, "tokens", "revoke", str(victim.token_id))
    printed = json.loads(done.stdout)
    assert printed["token_id"] == str(victim.token_id)
    # Another process's revocation arrives by NOTIFY: allow it a moment to travel.
    with trio.fail_after(2):
        while (await http.get(MISSING_CONTACT, headers=victim.headers)).status_code != 401:
            await trio.sleep(0.02)
    await assert_works(http, bystander.headers)


# --- 403 ---------------------------------------------------------------------------


async def test_missing_permission_is_403(http: httpx.AsyncClient, make_token: MakeToken) -> None:
    reader = await make_token(permissions=["contacts:read"])
    writer = await make_token(permissions=["contacts:write"])

    message = assert_error(
        await http.post("/contacts", json={"email": "r@example.com"}, headers=reader.headers),
        403,
        "FORBIDDEN",
    )
    assert "contacts:write" in message

    created = await http.post("/contacts", json={"email": "w@example.com"}, headers=writer.headers)
    assert created.status_code == 201, created.text
    contact_id = created.json()["data"]["id"]
    message = assert_error(
        await http.get(f"/contacts/{contact_id}", headers=writer.headers), 403, "FORBIDDEN"
    )
    assert "contacts:read" in message
    assert (await http.get(f"/contacts/{contact_id}", headers=reader.headers)).status_code == 200


# --- /tokens -----------------------------------------------------------------------


async def test_token_routes_need_tokens_manage_and_step_up(
    http: httpx.AsyncClient, make_token: MakeToken, acme: Credential
) -> None:
    without_manage = await make_token(permissions=["contacts:read", "contacts:write"], step_up=True)
    calls = [
        ("POST", "/tokens", {"permissions": ["contacts:read"]}),
        ("GET", "/tokens", None),
        ("DELETE", f"/tokens/{acme.token_id}", None),
    ]
    for method, path, body in calls:
        response = await http.request(method, path, json=body, headers=without_manage.headers)
        assert_error(response, 403, "FORBIDDEN")
        # acme holds every permission, tokens:manage included, but is not a step-up token.
        response = await http.request(method, path, json=body, headers=acme.headers)
        assert_error(response, 403, "STEP_UP_REQUIRED")
    # Nothing was revoked on the way.
    await assert_works(http, acme.headers)


async def test_create_token_over_http(http: httpx.AsyncClient, make_token: MakeToken) -> None:
    manager = await make_token(
        permissions=["tokens:manage", "contacts:read", "contacts:write"], step_up=True
    )
    response = await http.post(
        "/tokens",
        json={"name": "reader", "permissions": ["contacts:read"]},
        headers=manager.headers,
    )
    assert response.status_code == 201, response.text
    created = response.json()["data"]
    secret = created["token"]
    assert secret.startswith("svc_team_")
    assert created["permissions"] == ["contacts:read"]
    assert created["team_id"] == str(manager.team_id)
    assert created["status"] == "active"
    assert created["step_up"] is False
    assert created["expires_at"] is None
    uuid.UUID(created["id"])

    await assert_works(http, bearer(secret))
    assert_error(
        await http.post("/contacts", json={"email": "n@example.com"}, headers=bearer(secret)),
        403,
        "FORBIDDEN",
    )


async def test_cannot_grant_permissions_it_lacks(
    http: httpx.AsyncClient, make_token: MakeToken
) -> None:
    manager = await make_token(permissions=["tokens:manage", "contacts:read"], step_up=True)
    response = await http.post(
        "/tokens",
        json={"permissions": ["contacts:read", "contacts:write"]},
        headers=manager.headers,
    )
    message = assert_error(response, 403, "FORBIDDEN")
    assert "contacts:write" in message
    listed = await http.get("/tokens", headers=manager.headers)
    assert [t["id"] for t in listed.json()["data"]["data"]] == [str(manager.token_id)]


async def test_unknown_permission_is_400_naming_it(
    http: httpx.AsyncClient, make_token: MakeToken
) -> None:
    manager = await make_token(step_up=True)
    response = await http.post(
        "/tokens",
        json={"permissions": ["contacts:read", "contacts:fly"]},
        headers=manager.headers,
    )
    message = assert_error(response, 400, "BAD_REQUEST")
    assert "contacts:fly" in message
    empty = await http.post("/tokens", json={"permissions": []}, headers=manager.headers)
    assert_error(empty, 400, "BAD_REQUEST")


async def test_list_tokens_pages_and_shows_no_secret(
    http: httpx.AsyncClient, make_token: MakeToken, acme: Credential
) -> None:
    manager = await make_token(step_up=True)
    secrets = [acme.secret, manager.secret]
    ids = {str(acme.token_id), str(manager.token_id)}
    for name in ("one", "two"):
        response = await http.post(
            "/tokens",
            json={"name": name, "permissions": ["contacts:read"]},
            headers=manager.headers,
        )
        assert response.status_code == 201, response.text
        secrets.append(response.json()["data"]["token"])
        ids.add(response.json()["data"]["id"])
    await make_token(team="globex")  # another team's: never listed

    listed = await http.get("/tokens", headers=manager.headers)
    assert listed.status_code == 200, listed.text
    page = listed.json()["data"]
    assert page["object"] == "list"
    assert page["has_more"] is False
    assert {t["id"] for t in page["data"]} == ids
    for token in page["data"]:
        assert "token" not in token
        assert "secret" not in token and "secret_hash" not in token
        assert token["team_id"] == str(manager.team_id)
    for secret in secrets:
        assert secret not in listed.text

    seen = []
    for offset in range(4):
        response = await http.get(f"/tokens?limit=1&offset={offset}", headers=manager.headers)
        assert response.status_code == 200, response.text
        one = response.json()["data"]
        assert len(one["data"]) == 1
        assert one["has_more"] is (offset < 3)
        seen.append(one["data"][0]["id"])
    assert set(seen) == ids and len(seen) == 4
    assert_error(await http.get("/tokens?limit=0", headers=manager.headers), 400, "BAD_REQUEST")


async def test_revoke_token_over_http(http: httpx.AsyncClient, make_token: MakeToken) -> None:
    manager = await make_token(step_up=True)
    victim = await make_token(permissions=["contacts:read"])
    response = await http.delete(f"/tokens/{victim.token_id}", headers=manager.headers)
    assert response.status_code == 204
    assert response.content == b""
    assert_error(await http.get(MISSING_CONTACT, headers=victim.headers), 401, "UNAUTHORIZED")

    listed = await http.get("/tokens", headers=manager.headers)
    shown = {t["id"]: t for t in listed.json()["data"]["data"]}
    assert shown[str(victim.token_id)]["status"] == "revoked"
    assert shown[str(victim.token_id)]["revoked_at"] is not None

    missing = await http.delete(f"/tokens/{uuid.uuid4()}", headers=manager.headers)
    assert_error(missing, 404, "NOT_FOUND")
    assert_error(
        await http.delete("/tokens/not-a-uuid", headers=manager.headers), 400, "BAD_REQUEST"
    )


async def test_cannot_revoke_another_teams_token(
    http: httpx.AsyncClient, make_token: MakeToken
) -> None:
    manager = await make_token(team="acme", step_up=True)
    theirs = await make_token(team="globex", permissions=["contacts:read"])
    response = await http.delete(f"/tokens/{theirs.token_id}", headers=manager.headers)
    assert_error(response, 404, "NOT_FOUND")
    await assert_works(http, theirs.headers)


async def test_step_up_token_lives_at_most_15_minutes(
    http: httpx.AsyncClient, service: Service
) -> None:
    async with service.db.transaction() as conn:
        team_id = await token_store.ensure_team(conn, "acme")
        long, _ = await token_store.create_token(
            conn, team_id, ["tokens:manage"], expires_in=86400, step_up=True
        )
        default, _ = await token_store.create_token(conn, team_id, ["tokens:manage"], step_up=True)
        short, _ = await token_store.create_token(
            conn, team_id, ["tokens:manage"], expires_in=60, step_up=True
        )
    for token in (long, default):
        assert token.expires_at is not None
        lifetime = token.expires_at - token.created_at
        assert timedelta(0) < lifetime <= timedelta(minutes=15), lifetime
    assert short.expires_at is not None
    assert short.expires_at - short.created_at == timedelta(seconds=60)


async def test_step_up_tokens_cannot_be_made_over_http(
    http: httpx.AsyncClient, make_token: MakeToken
) -> None:
    """Else a step-up token could renew itself forever."""
    manager = await make_token(step_up=True)
    response = await http.post(
        "/tokens",
        json={"permissions": ["contacts:read"], "step_up": True},
        headers=manager.headers,
    )
    message = assert_error(response, 403, "FORBIDDEN")
    assert "step_up" in message


# --- the CLI -------------------------------------------------------------------


async def test_cli_creates_tokens(http: httpx.AsyncClient, database_url: str) -> None:
    first = await tidings_cli(
        database_url, "tokens", "create", "--team", "t1", "--permissions", "contacts:read"
    )
    lines = first.stdout.decode().splitlines()
    assert len(lines) == 1, first.stdout
    printed = json.loads(lines[0])
    assert set(printed) == {"team_id", "token_id", "token"}
    assert printed["token"].startswith("svc_team_")
    uuid.UUID(printed["team_id"])
    uuid.UUID(printed["token_id"])

    headers = bearer(printed["token"])
    await assert_works(http, headers)
    assert_error(
        await http.post("/contacts", json={"email": "c@example.com"}, headers=headers),
        403,
        "FORBIDDEN",
    )

    second = await tidings_cli(database_url, "tokens", "create", "--team", "t1")
    again = json.loads(second.stdout)
    assert again["team_id"] == printed["team_id"]
    assert again["token_id"] != printed["token_id"]
    assert again["token"] != printed["token"]


async def test_cli_refuses_an_unknown_permission(database_url: str, service: Service) -> None:
    done = await tidings_cli(
        database_url,
        "tokens",
        "create",
        "--team",
        "t1",
        "--permissions",
        "contacts:fly",
        check=False,
    )
    assert done.returncode != 0
    assert done.stdout == b""
    assert b"contacts:fly" in done.stderr
    async with service.db.acquire() as conn:
        assert await conn.fetchval("SELECT count(*) FROM teams WHERE name = 't1'") == 0


# --- storage -------------------------------------------------------------------


async def test_secrets_are_stored_only_as_a_hash(
    http: httpx.AsyncClient, make_token: MakeToken, service: Service
) -> None:
    manager = await make_token(step_up=True)
    response = await http.post(
        "/tokens", json={"permissions": ["contacts:read"]}, headers=manager.headers
    )
    assert response.status_code == 201, response.text
    secrets = [manager.secret, response.json()["data"]["token"]]
    async with service.db.acquire() as conn:
        rows = await conn.fetch("SELECT * FROM api_tokens")
    assert len(rows) == 2
    for row in rows:
        for column, value in dict(row).items():
            for secret in secrets:
                if isinstance(value, (bytes, bytearray, memoryview)):
                    assert secret.encode() not in bytes(value), column
                else:
                    assert secret not in str(value), column


async def _upload_in_two_parts(
    base_url: str, path: str, secret: str, body: bytes, between: Any
) -> tuple[int, dict[str, Any]]:
    """Send a request's head and the first byte of its body, run ``between``,
    then send the rest; the status and the JSON answer."""
    host, port = base_url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    await stream.send_all(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        f"Authorization: Bearer {secret}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:1])
    await between()
    await stream.send_all(body[1:])
    received = b""
    with trio.fail_after(10):
        while chunk := await stream.receive_some(65536):
            received += chunk
    await stream.aclose()
    head, _, answer = received.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(answer)


async def test_a_token_that_expires_while_its_body_arrives_writes_nothing(
    base_url: str, http: httpx.AsyncClient, make_token: MakeToken, client: httpx.AsyncClient
) -> None:
    """The token is checked before the body is read, and again once it is in:
    a body may take up to a minute to arrive."""
    for path, body, listed in (
        ("/contacts", b'{"email": "late@example.com"}', "/contacts"),  # a storage unit
        ("/domains", b'{"name": "late.example"}', "/domains"),  # a route on the trio side
    ):
        token = await make_token(expires_in=1.0)
        status, answer = await _upload_in_two_parts(
            base_url, path, token.secret, body, partial(trio.sleep, 1.3))
        assert status == 401 and "expired" in answer["error"]["message"], answer
        assert (await client.get(listed)).json()["data"]["data"] == []


async def test_a_token_revoked_while_its_body_arrives_writes_nothing(
    base_url: str, http: httpx.AsyncClient, make_token: MakeToken, client: httpx.AsyncClient
) -> None:
    manager = await make_token(permissions=["tokens:manage"], step_up=True)
    for path, body, listed in (
        ("/contacts", b'{"email": "late@example.com"}', "/contacts"),
        ("/domains", b'{"name": "late.example"}', "/domains"),
    ):
        victim = await make_token()
        await assert_works(http, victim.headers)  # cached

        async def revoke(victim: Credential = victim) -> None:
            revoked = await http.delete(f"/tokens/{victim.token_id}", headers=manager.headers)
            assert revoked.status_code == 204, revoked.text

        status, answer = await _upload_in_two_parts(base_url, path, victim.secret, body, revoke)
        assert status == 401 and "revoked" in answer["error"]["message"], answer
        assert (await client.get(listed)).json()["data"]["data"] == []
    # A token that stays valid is let through as ever.
    status, answer = await _upload_in_two_parts(
        base_url, "/contacts", (await make_token()).secret, b'{"email": "on@example.com"}',
        partial(trio.sleep, 0.1))
    assert status == 201 and answer["data"]["email"] == "on@example.com"
