"""A domain deleted, or deleted and verified again, is seen by the very next
send: whether a domain is verified is read with every claim of due emails,
never from a copy a process kept."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from tests.conftest import Credential, MakeToken
from tests.email.conftest import verified_domain
from tests.email.helpers import events, later, ok, send
from tidings.config import Config
from tidings.service import Service


@pytest.fixture
def config(database_url: str) -> Config:
    return Config(database_url=database_url, db_pool_size=6, rate_limit_per_second=0,
                  shutdown_grace_seconds=2, email_poll_seconds=0.2)


SETTLED = {"sent", "delivered", "failed", "bounced", "complained", "suppressed", "canceled"}


async def settled(client: httpx.AsyncClient, email_id: str) -> dict[str, Any]:
    with trio.fail_after(15):
        while True:
            email: dict[str, Any] = ok(await client.get(f"/emails/{email_id}"))
            if email["status"] in SETTLED:
                return email
            await trio.sleep(0.05)


async def delete(http: httpx.AsyncClient, make_token: MakeToken, client: httpx.AsyncClient,
                 name: str) -> None:
    domains = ok(await client.get("/domains"))["data"]
    (domain,) = [d for d in domains if d["name"] == name]
    step_up = await make_token(step_up=True, expires_in=600)
    deleted = await http.delete(f"/domains/{domain['id']}", headers=step_up.headers)
    assert deleted.status_code == 204, deleted.text


async def test_an_email_due_after_its_domain_was_deleted_is_not_sent(
    client: httpx.AsyncClient, http: httpx.AsyncClient, make_token: MakeToken, acme_domain: str,
) -> None:
    first = await send(client)  # the domain's key is now in use in this process
    assert (await settled(client, first))["status"] in ("sent", "delivered")
    due = await send(client, scheduled_at=later(seconds=1.5))
    await delete(http, make_token, client, acme_domain)
    assert (await settled(client, due))["status"] == "failed"
    failed = [e for e in await events(client, due) if e["type"] == "failed"]
    assert "acme.example is not a verified sending domain any more" in failed[0]["message"]


async def test_a_domain_verified_again_sends_at_once(
    client: httpx.AsyncClient, http: httpx.AsyncClient, make_token: MakeToken,
    service: Service, base_url: str, acme: Credential, acme_domain: str,
) -> None:
    due = await send(client, scheduled_at=later(seconds=1))
    await delete(http, make_token, client, acme_domain)
    assert (await settled(client, due))["status"] == "failed"  # not verified, seen once
    await verified_domain(service, base_url, acme, acme_domain)
    again = await send(client)
    assert (await settled(client, again))["status"] in ("sent", "delivered")
