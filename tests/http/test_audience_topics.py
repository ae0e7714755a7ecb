"""Topics, each contact's subscription per topic, and the set-based question
the sending paths ask: which of these contacts are subscribed to topic T."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import trio

from tests.conftest import MakeToken, assert_error
from tests.http.audience import create, make, ok
from tidings.service import Service
from tidings.storage import topics as topic_store


async def topic(client: httpx.AsyncClient, name: str, default: str, **more: Any) -> dict[str, Any]:
    return await make(client, "/topics", name=name, default_subscription=default, **more)


async def test_topic_lifecycle(client: httpx.AsyncClient) -> None:
    news = await topic(client, "News", "opt_in", description="Monthly news")
    assert news["object"] == "topic"
    assert (news["name"], news["description"], news["default_subscription"]) == (
        "News", "Monthly news", "opt_in"
    )
    offers = await topic(client, "Offers", "opt_out")
    listed = ok(await client.get("/topics"))
    assert [t["id"] for t in listed["data"]] == [offers["id"], news["id"]]
    assert ok(await client.get(f"/topics/{news['id']}")) == news

    renamed = ok(await client.patch(f"/topics/{news['id']}", json={"name": "Newsletter"}))
    assert renamed["name"] == "Newsletter" and renamed["description"] == "Monthly news"
    cleared = ok(await client.patch(
        f"/topics/{news['id']}", json={"description": None, "default_subscription": "opt_out"}
    ))
    assert cleared["description"] is None and cleared["default_subscription"] == "opt_out"

    ok(await client.delete(f"/topics/{news['id']}"), 204)
    for method in ("GET", "DELETE"):
        response = await client.request(method, f"/topics/{news['id']}")
        assert_error(response, 404, "NOT_FOUND")
    assert_error(
        await client.patch(f"/topics/{news['id']}", json={"name": "X"}), 404, "NOT_FOUND"
    )


async def test_topic_refusals(client: httpx.AsyncClient) -> None:
    existing = await topic(client, "Existing", "opt_in")
    refusals: list[tuple[str, dict[str, Any], str]] = [
        ("POST", {"default_subscription": "opt_in"}, "name"),
        ("POST", {"name": "", "default_subscription": "opt_in"}, "name"),
        ("POST", {"name": "x" * 101, "default_subscription": "opt_in"}, "name"),
        ("POST", {"name": "News"}, "default_subscription"),
        ("POST", {"name": "News", "default_subscription": "yes"}, "default_subscription"),
        ("POST", {"name": "N", "default_subscription": "opt_in", "description": "d" * 501},
         "description"),
        ("PATCH", {}, "at least one field"),
        ("PATCH", {"name": None}, "name"),
        ("PATCH", {"default_subscription": None}, "default_subscription"),
        ("PATCH", {"visibility": "public"}, "visibility"),
    ]
    for method, body, field in refusals:
        path = "/topics" if method == "POST" else f"/topics/{existing['id']}"
        message = assert_error(await client.request(method, path, json=body), 400, "BAD_REQUEST")
        assert field in message, body
    assert ok(await client.get("/topics"))["data"] == [existing]


def by_name(listed: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    return {t["name"]: (t["subscription"], t["is_default"]) for t in listed["data"]}


async def test_a_contact_without_a_choice_has_the_default(client: httpx.AsyncClient) -> None:
    news = await topic(client, "News", "opt_in")
    offers = await topic(client, "Offers", "opt_out")
    contact = await create(client, email="ada@example.com")
    path = f"/contacts/{contact['id']}/topics"

    listed = ok(await client.get(path))
    assert listed["object"] == "list" and listed["has_more"] is False
    assert listed["data"][0]["object"] == "contact_topic"
    assert by_name(listed) == {"News": ("opt_in", True), "Offers": ("opt_out", True)}

    chosen = ok(await client.patch(path, json={"topics": [
        {"id": news["id"], "subscription": "opt_out"},
        {"id": offers["id"], "subscription": "opt_in"},
    ]}))
    assert by_name(chosen) == {"News": ("opt_out", False), "Offers": ("opt_in", False)}
    assert by_name(ok(await client.get(path))) == by_name(chosen)

    # A new default reaches only contacts without a choice.
    other = await create(client, email="grace@example.com")
    ok(await client.patch(f"/topics/{news['id']}", json={"default_subscription": "opt_out"}))
    assert by_name(ok(await client.get(f"/contacts/{other['id']}/topics")))["News"] == (
        "opt_out", True
    )
    ok(await client.patch(f"/topics/{news['id']}", json={"default_subscription": "opt_in"}))
    assert by_name(ok(await client.get(path)))["News"] == ("opt_out", False)

    # null takes the choice back: the default again.
    back = {"topics": [{"id": news["id"], "subscription": None}]}
    reset = ok(await client.patch(path, json=back))
    assert by_name(reset) == {"News": ("opt_in", True)}

    paged = ok(await client.get(path, params={"limit": 1}))
    assert len(paged["data"]) == 1 and paged["has_more"] is True

    # Deleting a topic takes every choice for it along.
    ok(await client.delete(f"/topics/{offers['id']}"), 204)
    assert by_name(ok(await client.get(path))) == {"News": ("opt_in", True)}


async def test_a_contact_is_named_by_id_or_email(client: httpx.AsyncClient) -> None:
    news = await topic(client, "News", "opt_in")
    contact = await create(client, email="Ada@Example.com")
    body = {"topics": [{"id": news["id"], "subscription": "opt_out"}]}
    chosen = ok(await client.patch("/contacts/ADA@example.com/topics", json=body))
    assert by_name(chosen) == {"News": ("opt_out", False)}
    for ref in ("ada@example.com", "Ada@Example.com", contact["id"]):
        assert ok(await client.get(f"/contacts/{ref}/topics")) == chosen

    assert_error(await client.get("/contacts/nobody@example.com/topics"), 404, "NOT_FOUND")
    missing = await client.patch("/contacts/nobody@example.com/topics", json=body)
    assert assert_error(missing, 404, "NOT_FOUND") == "contact not found"
    for response in (
        await client.get("/contacts/ada-lovelace/topics"),
        await client.patch("/contacts/ada-lovelace/topics", json=body),
    ):
        assert "contact_id" in assert_error(response, 400, "BAD_REQUEST")


async def test_contact_topic_refusals(client: httpx.AsyncClient) -> None:
    news = await topic(client, "News", "opt_in")
    contact = await create(client, email="ada@example.com")
    path = f"/contacts/{contact['id']}/topics"
    unknown = str(uuid.uuid4())

    response = await client.patch(path, json={"topics": [
        {"id": news["id"], "subscription": "opt_out"}, {"id": unknown, "subscription": "opt_in"},
    ]})
    assert unknown in assert_error(response, 404, "NOT_FOUND")
    # Nothing was recorded.
    assert by_name(ok(await client.get(path))) == {"News": ("opt_in", True)}

    refusals = [
        ({"topics": []}, "topics"),
        ({"topics": [{"id": news["id"]}]}, "subscription"),
        ({"topics": [{"id": news["id"], "subscription": "yes"}]}, "subscription"),
        ({"topics": [{"id": "news", "subscription": "opt_in"}]}, "id"),
        ({"topics": [{"id": news["id"], "subscription": "opt_in"}] * 2}, "twice"),
        ({}, "topics"),
    ]
    for body, needle in refusals:
        message = assert_error(await client.patch(path, json=body), 400, "BAD_REQUEST")
        assert needle in message, (body, message)
    missing = f"/contacts/{uuid.uuid4()}/topics"
    assert_error(await client.get(missing), 404, "NOT_FOUND")
    body = {"topics": [{"id": news["id"], "subscription": "opt_in"}]}
    assert_error(await client.patch(missing, json=body), 404, "NOT_FOUND")


async def test_choices_racing_a_deletion_are_404_naming_what_is_gone(
    client: httpx.AsyncClient,
) -> None:
    """Choices recorded while a topic or the contact is deleted answer 200 (they
    came first) or 404 naming the topic or the contact; never 500."""
    statuses: list[int] = []

    async def choose(contact_id: str, topic_ids: list[str], gone: str) -> None:
        body = {"topics": [{"id": t, "subscription": "opt_out"} for t in topic_ids]}
        response = await client.patch(f"/contacts/{contact_id}/topics", json=body)
        statuses.append(response.status_code)
        if response.status_code != 200:
            assert assert_error(response, 404, "NOT_FOUND") == f"{gone} not found"

    async def delete(path: str) -> None:
        ok(await client.delete(path), 204)

    for round_ in range(8):
        topics = [await topic(client, f"T{round_}.{n}", "opt_in") for n in range(3)]
        ids = [t["id"] for t in topics]
        contacts = [await create(client, email=f"r{round_}.{n}@example.com") for n in range(4)]
        async with trio.open_nursery() as nursery:
            for contact in contacts:
                nursery.start_soon(choose, contact["id"], ids, f"topic {ids[0]}")
            nursery.start_soon(delete, f"/topics/{ids[0]}")

        doomed = await create(client, email=f"doomed{round_}@example.com")
        async with trio.open_nursery() as nursery:
            for topic_id in ids[1:] * 2:
                nursery.start_soon(choose, doomed["id"], [topic_id], "contact")
            nursery.start_soon(delete, f"/contacts/{doomed['id']}")
    assert set(statuses) <= {200, 404}


async def test_subscribed_contacts_is_one_question_for_many_contacts(
    client: httpx.AsyncClient, service: Service, http: httpx.AsyncClient, make_token: MakeToken
) -> None:
    news = await topic(client, "News", "opt_in")
    offers = await topic(client, "Offers", "opt_out")
    contacts = [await create(client, email=f"c{n}@example.com") for n in range(4)]
    ids = [uuid.UUID(c["id"]) for c in contacts]
    for choice in ("opt_out", "opt_in"):  # the last choice counts: opted in to both
        ok(await client.patch(f"/contacts/{contacts[0]['id']}/topics", json={"topics": [
            {"id": news["id"], "subscription": choice},
            {"id": offers["id"], "subscription": choice},
        ]}))
    ok(await client.patch(f"/contacts/{contacts[1]['id']}/topics", json={"topics": [
        {"id": news["id"], "subscription": "opt_out"},
    ]}))
    globex = await make_token(team="globex")
    stranger = ok(await http.post(
        "/contacts", json={"email": "s@example.com"}, headers=globex.headers
    ), 201)
    team_id = uuid.UUID(contacts[0]["team_id"])

    async with service.db.acquire() as conn:
        subscribed = topic_store.subscribed_contacts
        everyone = [*ids, uuid.UUID(stranger["id"]), uuid.uuid4()]
        assert await subscribed(conn, team_id, uuid.UUID(news["id"]), everyone) == {
            ids[0], ids[2], ids[3]
        }
        assert await subscribed(conn, team_id, uuid.UUID(offers["id"]), everyone) == {ids[0]}
        assert await subscribed(conn, team_id, uuid.UUID(news["id"]), []) == set()
        assert await subscribed(conn, team_id, uuid.uuid4(), ids) == set()
        # Another team's topic subscribes nobody here.
        other_topic = ok(await http.post(
            "/topics", json={"name": "G", "default_subscription": "opt_in"},
            headers=globex.headers,
        ), 201)
        assert await subscribed(conn, team_id, uuid.UUID(other_topic["id"]), ids) == set()
