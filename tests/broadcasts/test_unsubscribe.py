"""Unsubscribe links: signed in SQL, checked in Python; forged or altered → 404;
topic-only and all-broadcast unsubscribes; the page works without JavaScript."""

from __future__ import annotations

import json
from uuid import UUID, uuid4

import httpx

from tests.broadcasts.conftest import Audience, draft
from tests.broadcasts.helpers import emails_of, wait_status
from tests.conftest import assert_error
from tests.email.helpers import ok
from tidings.service import Service
from tidings.unsubscribe import TokenKey


async def links(client: httpx.AsyncClient, service: Service, audience: Audience,
                **fields: object) -> dict[str, str]:
    """Send a broadcast; the unsubscribe path of each recipient's email."""
    bid = ok(await client.post("/broadcasts", json=draft(audience, **fields)), 201)["id"]
    ok(await client.post(f"/broadcasts/{bid}/send"))
    await wait_status(service, bid, "sent")
    found = {}
    for email in await emails_of(service, bid):
        link = json.loads(email["headers"])["List-Unsubscribe"][1:-1]
        found[email["to_addresses"][0]] = link.removeprefix("http://127.0.0.1:8080")
    return found


def test_tokens_name_what_they_were_signed_for_and_nothing_else() -> None:
    key, other = TokenKey(b"k" * 32), TokenKey(b"j" * 32)
    team, contact, topic = uuid4(), uuid4(), uuid4()
    token = key.sign(team, contact, topic)
    found = key.verify(token)
    assert found is not None and (found.team_id, found.contact_id, found.topic_id) == (
        team, contact, topic)
    assert key.verify(key.sign(team, contact, None)).topic_id is None  # type: ignore[union-attr]
    assert other.verify(token) is None
    for position in (5, 30, len(token) - 3):
        flipped = "A" if token[position] != "A" else "B"
        assert key.verify(token[:position] + flipped + token[position + 1:]) is None
    assert key.verify(token + "A") is None and key.verify("") is None
    assert key.verify("%%%") is None


async def test_topic_link_opts_out_of_the_topic_only(
    client: httpx.AsyncClient, http: httpx.AsyncClient, service: Service, audience: Audience
) -> None:
    found = await links(client, service, audience, topic_id=audience.topic_id)
    ada = found["ada@example.com"]
    page = await http.get(ada)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<form method="post">' in page.text and "<script" not in page.text
    assert "News" in page.text
    done = await http.post(ada, content=b"List-Unsubscribe=One-Click",
                           headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert ok(done)["unsubscribed"] is True
    topics = ok(await client.get(f"/contacts/{audience.contacts['ada']}/topics"))["data"]
    assert [t["subscription"] for t in topics if t["id"] == audience.topic_id] == ["opt_out"]
    assert ok(await client.get(f"/contacts/{audience.contacts['ada']}"))["unsubscribed"] is False
    # The next broadcast of the topic skips ada; one without a topic does not.
    assert "ada@example.com" not in await links(client, service, audience,
                                                topic_id=audience.topic_id)
    assert "ada@example.com" in await links(client, service, audience)


async def test_link_without_topic_unsubscribes_from_all_broadcasts(
    client: httpx.AsyncClient, http: httpx.AsyncClient, service: Service, audience: Audience
) -> None:
    bob = (await links(client, service, audience))["bob@example.com"]
    page = await http.post(bob, headers={"Accept": "text/html"})
    assert page.status_code == 200 and "no longer receive" in page.text
    assert ok(await client.get(f"/contacts/{audience.contacts['bob']}"))["unsubscribed"] is True
    assert ok(await http.post(bob))["unsubscribed"] is True  # twice is once
    # The page goes to a client that names text/html (a browser's form post);
    # JSON to one that refuses it (q=0), prefers JSON, or takes anything.
    browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
    for accept, html in ((browser, True), ("text/html;q=0, application/json", False),
                         ("application/json, text/html;q=0.5", False), ("*/*", False)):
        answer = await http.post(bob, headers={"Accept": accept})
        assert answer.status_code == 200, accept
        assert answer.headers["content-type"].startswith(
            "text/html" if html else "application/json"), accept


async def test_forged_or_altered_links_are_404(
    client: httpx.AsyncClient, http: httpx.AsyncClient, service: Service, audience: Audience
) -> None:
    ada = (await links(client, service, audience))["ada@example.com"]
    token = ada.rsplit("/", 1)[1]
    team = (await service.broadcasts.token_key()).verify(token)
    assert team is not None
    forged = TokenKey(b"f" * 32).sign(team.team_id, UUID(audience.contacts["bob"]), None)
    altered = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
    for bad in (forged, altered, "nonsense"):
        assert_error(await http.post(f"/unsubscribe/{bad}"), 404, "NOT_FOUND")
        assert_error(await http.get(f"/unsubscribe/{bad}"), 404, "NOT_FOUND")
    assert ok(await client.get(f"/contacts/{audience.contacts['bob']}"))["unsubscribed"] is False
