"""Sending domains over HTTP with the sandbox provider: the records to
publish, verification at once, deletion rules, names, permissions."""

from __future__ import annotations

import base64
import uuid
from typing import Any

import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.conftest import Credential, MakeToken, assert_error
from tests.http.audience import ok
from tidings.service import Service
from tidings.storage import domains as store


async def add(client: httpx.AsyncClient, name: str) -> dict[str, Any]:
    data: dict[str, Any] = ok(await client.post("/domains", json={"name": name}), 201)
    return data


async def test_create_returns_the_records_to_publish(client: httpx.AsyncClient) -> None:
    response = await client.post("/domains", json={"name": "Mail.Example.COM."})
    domain = ok(response, 201)
    assert "PRIVATE" not in response.text
    assert domain["object"] == "domain"
    assert domain["name"] == "mail.example.com"
    assert domain["status"] == "pending" and domain["verified_at"] is None
    by_purpose = {record["purpose"]: record for record in domain["records"]}
    assert set(by_purpose) == {"spf", "dkim", "dmarc", "return_path"}
    assert all(record["status"] == "pending" for record in domain["records"])

    spf = by_purpose["spf"]
    assert (spf["type"], spf["name"]) == ("TXT", "bounces.mail.example.com")
    assert spf["value"] == "v=spf1 a:localhost ~all"
    dkim = by_purpose["dkim"]
    assert dkim["type"] == "TXT"
    selector, _, rest = dkim["name"].partition(".")
    assert rest == "_domainkey.mail.example.com" and selector
    assert dkim["value"].startswith("v=DKIM1; k=rsa; p=")
    der = base64.b64decode(dkim["value"].split("p=")[1])
    key = serialization.load_der_public_key(der)
    assert isinstance(key, rsa.RSAPublicKey) and key.key_size == 2048
    dmarc = by_purpose["dmarc"]
    assert (dmarc["type"], dmarc["name"]) == ("TXT", "_dmarc.mail.example.com")
    assert dmarc["value"].startswith("v=DMARC1;")
    mx = by_purpose["return_path"]
    assert (mx["type"], mx["name"], mx["value"], mx["priority"]) == (
        "MX", "bounces.mail.example.com", "localhost", 10
    )

    assert ok(await client.get(f"/domains/{domain['id']}")) == domain
    listed = ok(await client.get("/domains"))
    assert listed["data"] == [domain] and listed["has_more"] is False


async def test_each_domain_has_its_own_key(client: httpx.AsyncClient) -> None:
    one = await add(client, "one.example")
    two = await add(client, "two.example")
    keys = [
        next(r["value"] for r in d["records"] if r["purpose"] == "dkim") for d in (one, two)
    ]
    assert keys[0] != keys[1]


async def test_sandbox_verifies_at_once(client: httpx.AsyncClient, service: Service,
                                        acme: Credential) -> None:
    domain = await add(client, "example.com")
    async with service.db.acquire() as conn:
        assert await store.sending_domain(conn, acme.team_id, "example.com") is None
    verified = ok(await client.post(f"/domains/{domain['id']}/verify"))
    assert verified["status"] == "verified" and verified["verified_at"]
    assert verified["last_checked_at"]
    assert {r["status"] for r in verified["records"]} == {"verified"}
    assert all(r["checked_at"] and r["changed_at"] for r in verified["records"])

    async with service.db.acquire() as conn:
        sending = await store.sending_domain(conn, acme.team_id, "EXAMPLE.com")
        other_team = await store.sending_domain(conn, uuid.uuid4(), "example.com")
    assert other_team is None
    assert sending is not None
    assert sending.name == "example.com" and sending.return_path == "bounces.example.com"
    assert sending.dkim_private_key.startswith(b"-----BEGIN RSA PRIVATE KEY-----")
    dkim = next(r for r in verified["records"] if r["purpose"] == "dkim")
    assert dkim["name"] == f"{sending.dkim_selector}._domainkey.example.com"
    private = serialization.load_pem_private_key(sending.dkim_private_key, None)
    public = private.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    assert dkim["value"].endswith(base64.b64encode(public).decode())


async def test_delete_rules(client: httpx.AsyncClient, http: httpx.AsyncClient,
                            make_token: MakeToken) -> None:
    pending = await add(client, "pending.example")
    ok(await client.delete(f"/domains/{pending['id']}"), 204)
    assert_error(await client.get(f"/domains/{pending['id']}"), 404, "NOT_FOUND")
    assert_error(await client.delete(f"/domains/{pending['id']}"), 404, "NOT_FOUND")

    verified = await add(client, "verified.example")
    ok(await client.post(f"/domains/{verified['id']}/verify"))
    assert_error(await client.delete(f"/domains/{verified['id']}"), 403, "STEP_UP_REQUIRED")
    assert ok(await client.get(f"/domains/{verified['id']}"))["status"] == "verified"
    step_up = await make_token(step_up=True, expires_in=600)
    ok(await http.delete(f"/domains/{verified['id']}", headers=step_up.headers), 204)
    assert_error(await client.get(f"/domains/{verified['id']}"), 404, "NOT_FOUND")
    # The name is free again, with a new key.
    again = await add(client, "verified.example")
    assert again["id"] != verified["id"]


async def test_names(client: httpx.AsyncClient) -> None:
    idn = await add(client, "Bücher.example")
    assert idn["name"] == "xn--bcher-kva.example"
    assert any(r["name"] == "_dmarc.xn--bcher-kva.example" for r in idn["records"])
    # The same name in either form, or another case, is the same domain.
    for same in ("xn--bcher-kva.example", "BÜCHER.example", "bücher.example."):
        message = assert_error(
            await client.post("/domains", json={"name": same}), 409, "CONFLICT"
        )
        assert "name" in message
    for bad in ("", "localhost", "example", "-bad.example", "bad-.example", "a..example",
                "under_score.example", "ex ample.com", "user@example.com", "127.0.0.1",
                "example.123", "x" * 64 + ".example", ("a" * 60 + ".") * 5 + "com",
                "xn--zz.example", "http://example.com"):
        message = assert_error(
            await client.post("/domains", json={"name": bad}), 400, "BAD_REQUEST"
        )
        assert "name" in message, (bad, message)
    # Special-use names (RFC 6761): no address can be sent from them.
    for special in ("shop.test", "mail.example.invalid", "printer.local", "app.localhost",
                    "hidden.onion", "1.168.192.in-addr.arpa", "R1.TEST."):
        message = assert_error(
            await client.post("/domains", json={"name": special}), 400, "BAD_REQUEST"
        )
        assert "name" in message and "special-use" in message, (special, message)
    # A sending domain fits 209 characters in its ASCII form, so that its DKIM
    # record name (253 at most) and bounce address (254) fit; 253 would be a
    # valid host name.
    longest = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 13, "com"])
    assert (await add(client, longest))["name"] == longest
    idn = ".".join(["bücher" * 7] * 4) + ".example.net"
    for bad in (longest.replace(".ddd", ".dddd"), ".".join(["a" * 63] * 3 + ["b" * 61]), idn):
        message = assert_error(
            await client.post("/domains", json={"name": bad}), 400, "BAD_REQUEST"
        )
        assert "name" in message and "at most 209" in message, (bad, message)
        assert "DKIM record name and bounce address" in message, message
    assert_error(await client.post("/domains", json={}), 400, "BAD_REQUEST")
    assert_error(await client.post("/domains", json={"name": 5}), 400, "BAD_REQUEST")
    assert_error(
        await client.post("/domains", json={"name": "a.example", "x": 1}), 400, "BAD_REQUEST"
    )


async def test_permissions_and_teams(
    client: httpx.AsyncClient, http: httpx.AsyncClient, make_token: MakeToken
) -> None:
    domain = await add(client, "example.com")
    reader = await make_token(permissions=["domains:read"])
    assert ok(await http.get(f"/domains/{domain['id']}", headers=reader.headers))
    for method, path in (("POST", "/domains"), ("POST", f"/domains/{domain['id']}/verify"),
                         ("DELETE", f"/domains/{domain['id']}")):
        response = await http.request(
            method, path, headers=reader.headers, json={"name": "other.example"}
        )
        assert_error(response, 403, "FORBIDDEN")
    nobody = await make_token(permissions=["email:send"])
    assert_error(await http.get("/domains", headers=nobody.headers), 403, "FORBIDDEN")

    other = await make_token(team="globex")
    for method, path in (("GET", f"/domains/{domain['id']}"),
                         ("POST", f"/domains/{domain['id']}/verify"),
                         ("DELETE", f"/domains/{domain['id']}")):
        assert_error(await http.request(method, path, headers=other.headers), 404, "NOT_FOUND")
    assert ok(await http.get("/domains", headers=other.headers))["data"] == []
    # Another team may add the same name: each proves it with its own records.
    ok(await http.post("/domains", headers=other.headers, json={"name": "example.com"}), 201)
    assert_error(await client.get("/domains/not-a-uuid"), 400, "BAD_REQUEST")


async def test_paging(client: httpx.AsyncClient) -> None:
    made = [await add(client, f"d{i}.example") for i in range(3)]
    first = ok(await client.get("/domains", params={"limit": 2}))
    assert [d["id"] for d in first["data"]] == [made[2]["id"], made[1]["id"]]
    assert first["has_more"] is True
    rest = ok(await client.get("/domains", params={"limit": 2, "offset": 2}))
    assert [d["id"] for d in rest["data"]] == [made[0]["id"]] and rest["has_more"] is False
