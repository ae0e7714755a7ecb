"""Broadcast fixtures: a verified sending domain and a small audience of team acme."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.conftest import Credential
from tests.email.conftest import verified_domain
from tests.email.helpers import ok
from tidings.service import Service


@dataclass
class Audience:
    """A segment of acme with one contact of each kind, by name."""

    segment_id: str
    topic_id: str
    contacts: dict[str, str]


async def add_contact(client: httpx.AsyncClient, segment_id: str, **fields: Any) -> str:
    contact = ok(await client.post("/contacts", json=fields), 201)
    ok(await client.post(f"/contacts/{contact['id']}/segments/{segment_id}"))
    return str(contact["id"])


@pytest.fixture
async def acme_domain(service: Service, base_url: str, acme: Credential) -> str:
    return await verified_domain(service, base_url, acme, "acme.example")


@pytest.fixture
async def audience(client: httpx.AsyncClient, acme_domain: str) -> Audience:
    """Eligible: ada, bob (opted in to the topic). Ineligible: carl (unsubscribed),
    dora (suppressed), eve (no email), finn (opted out of the topic)."""
    segment = ok(await client.post("/segments", json={"name": "everyone"}), 201)
    topic = ok(await client.post(
        "/topics", json={"name": "News", "default_subscription": "opt_in"}
    ), 201)
    sid = segment["id"]
    contacts = {
        "ada": await add_contact(client, sid, email="ada@example.com", first_name="Ada"),
        "bob": await add_contact(client, sid, email="bob@example.com", first_name="Bob"),
        "carl": await add_contact(client, sid, email="carl@example.com", unsubscribed=True),
        "dora": await add_contact(client, sid, email="Dora@Example.com", first_name="Dora"),
        "eve": await add_contact(client, sid, phone="+14155550100", first_name="Eve"),
        "finn": await add_contact(client, sid, email="finn@example.com", first_name="Finn"),
    }
    ok(await client.post("/suppressions", json={"address": "dora@example.com"}), 201)
    ok(await client.patch(
        f"/contacts/{contacts['finn']}/topics",
        json={"topics": [{"id": topic["id"], "subscription": "opt_out"}]},
    ))
    return Audience(sid, topic["id"], contacts)


def draft(audience: Audience, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "Spring news",
        "segment_id": audience.segment_id,
        "from_email": "news@acme.example",
        "from_name": "Acme News",
        "subject": "Hello {{{first_name}}}",
        "html": "<p>Hi {{{first_name}}}, {{{promo}}}</p><a href=\"{{{unsubscribe_url}}}\">x</a>",
        "variable_bindings": {"promo": "20% off", "first_name": "friend"},
    }
    body.update(fields)
    return body
