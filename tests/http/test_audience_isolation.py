"""Team isolation: another team's ids are 404 on every audience route, and
lists never show another team's rows."""

from __future__ import annotations

from typing import Any

import httpx

from tests.conftest import MakeToken, assert_error
from tests.http.audience import create, define, make, ok
from tidings.http import (
    contact_import,
    contact_properties,
    contacts,
    segments,
    suppressions,
    topics,
)
from tidings.http.app import all_routes

AUDIENCE_TAGS = {
    group.tag
    for group in (contacts.routes, contact_import.routes, contact_properties.routes,
                  topics.routes, segments.routes, suppressions.routes)
}


async def world(client: httpx.AsyncClient, team: str) -> dict[str, Any]:
    """One of everything, in the client's team."""
    prop = await define(client, key="plan", type="string")
    contact = await create(client, email=f"ada@{team}.example", properties={"plan": "pro"})
    segment = await make(client, "/segments", name=f"VIP of {team}")
    topic = await make(client, "/topics", name="News", default_subscription="opt_in")
    suppression = await make(client, "/suppressions", address=f"bounced@{team}.example")
    ok(await client.post(f"/contacts/{contact['id']}/segments/{segment['id']}"))
    ok(await client.patch(f"/contacts/{contact['id']}/topics",
                          json={"topics": [{"id": topic["id"], "subscription": "opt_out"}]}))
    return {"property": prop, "contact": contact, "segment": segment, "topic": topic,
            "suppression": suppression}


async def snapshot(client: httpx.AsyncClient, mine: dict[str, Any]) -> list[Any]:
    contact, segment = mine["contact"]["id"], mine["segment"]["id"]
    paths = [
        f"/contacts/{contact}", f"/contacts/{contact}/segments", f"/contacts/{contact}/topics",
        f"/segments/{segment}", f"/segments/{segment}/contacts",
        f"/topics/{mine['topic']['id']}", f"/contact-properties/{mine['property']['id']}",
        f"/suppressions/{mine['suppression']['id']}",
    ]
    return [ok(await client.get(path)) for path in paths]


async def test_another_teams_ids_are_404_everywhere(
    client: httpx.AsyncClient, http: httpx.AsyncClient, make_token: MakeToken
) -> None:
    acme = await world(client, "acme")
    before = await snapshot(client, acme)
    globex_token = await make_token(team="globex")
    async with httpx.AsyncClient(
        base_url=str(client.base_url), headers=globex_token.headers, timeout=30
    ) as globex_client:
        globex = await world(globex_client, "globex")

    contact, segment, topic = acme["contact"]["id"], acme["segment"]["id"], acme["topic"]["id"]
    prop, suppression = acme["property"]["id"], acme["suppression"]["id"]
    own_contact, own_segment = globex["contact"]["id"], globex["segment"]["id"]
    choice = {"topics": [{"id": topic, "subscription": "opt_in"}]}
    own_choice = {"topics": [{"id": globex["topic"]["id"], "subscription": "opt_in"}]}
    attempts: list[tuple[str, str, Any, dict[str, Any] | None]] = [
        ("GET", f"/contacts/{contact}", None, None),
        ("GET", "/contacts/ada@acme.example", None, None),
        ("PATCH", f"/contacts/{contact}", {"first_name": "Mallory"}, None),
        ("PATCH", "/contacts/ada@acme.example", {"first_name": "Mallory"}, None),
        ("DELETE", f"/contacts/{contact}", None, None),
        ("DELETE", "/contacts/ada@acme.example", None, None),
        ("GET", "/contacts", None, {"segment_id": segment}),
        ("GET", f"/contacts/{contact}/segments", None, None),
        ("GET", "/contacts/ada@acme.example/segments", None, None),
        ("POST", f"/contacts/{contact}/segments/{segment}", None, None),
        ("POST", f"/contacts/{own_contact}/segments/{segment}", None, None),
        ("POST", f"/contacts/{contact}/segments/{own_segment}", None, None),
        ("POST", f"/contacts/ada@acme.example/segments/{own_segment}", None, None),
        ("POST", f"/contacts/ada@globex.example/segments/{segment}", None, None),
        ("DELETE", f"/contacts/{contact}/segments/{segment}", None, None),
        ("DELETE", f"/contacts/{own_contact}/segments/{segment}", None, None),
        ("DELETE", f"/contacts/{contact}/segments/{own_segment}", None, None),
        ("DELETE", f"/contacts/ada@acme.example/segments/{segment}", None, None),
        ("DELETE", f"/contacts/ada@acme.example/segments/{own_segment}", None, None),
        ("GET", f"/contacts/{contact}/topics", None, None),
        ("GET", "/contacts/ada@acme.example/topics", None, None),
        ("PATCH", f"/contacts/{contact}/topics", own_choice, None),
        ("PATCH", "/contacts/ada@acme.example/topics", own_choice, None),
        ("PATCH", f"/contacts/{own_contact}/topics", choice, None),
        ("PATCH", "/contacts/ada@globex.example/topics", choice, None),
        ("POST", "/contacts/import", [{"email": "x@globex.example"}], {"segment_id": segment}),
        ("POST", "/contacts/import", {"segment_id": segment, "contacts": []}, None),
        ("GET", f"/contact-properties/{prop}", None, None),
        ("PATCH", f"/contact-properties/{prop}", {"fallback_value": "free"}, None),
        ("DELETE", f"/contact-properties/{prop}", None, None),
        ("GET", f"/topics/{topic}", None, None),
        ("PATCH", f"/topics/{topic}", {"name": "Mine"}, None),
        ("DELETE", f"/topics/{topic}", None, None),
        ("GET", f"/segments/{segment}", None, None),
        ("DELETE", f"/segments/{segment}", None, None),
        ("GET", f"/segments/{segment}/contacts", None, None),
        ("GET", f"/suppressions/{suppression}", None, None),
        ("DELETE", f"/suppressions/{suppression}", None, None),
    ]
    tried: set[tuple[str, str]] = set()
    for method, path, body, params in attempts:
        response = await http.request(
            method, path, json=body, params=params, headers=globex_token.headers
        )
        assert_error(response, 404, "NOT_FOUND")
        assert "acme" not in response.text
        tried.add((method, path.replace(contact, "{contact_id}")
                   .replace(own_contact, "{contact_id}").replace("ada@acme.example", "{contact_id}")
                   .replace("ada@globex.example", "{contact_id}")
                   .replace(segment, "{segment_id}").replace(own_segment, "{segment_id}")
                   .replace(topic, "{topic_id}").replace(prop, "{property_id}")
                   .replace(suppression, "{suppression_id}")))

    # Every audience route that names a resource was tried.
    named = {(route.method, route.path) for route in all_routes()
             if route.tag in AUDIENCE_TAGS and route.path_params}
    assert named <= tried, named - tried

    # Nothing of acme's changed, and nothing of acme's shows in globex's lists.
    assert await snapshot(client, acme) == before
    for path in ("/contacts", "/segments", "/topics", "/contact-properties", "/suppressions"):
        listed = ok(await http.get(path, headers=globex_token.headers))
        assert len(listed["data"]) == 1, path
        assert "acme.example" not in str(listed) and listed["data"][0]["team_id"] == str(
            globex_token.team_id
        )
    # Property definitions are per team too.
    ok(await http.post("/contact-properties", json={"key": "seats", "type": "number"},
                       headers=globex_token.headers), 201)
    refused = await client.post(
        "/contacts", json={"email": "b@acme.example", "properties": {"seats": 1}}
    )
    assert_error(refused, 422, "UNPROCESSABLE_ENTITY")


async def test_an_email_names_the_contact_of_the_callers_team(
    client: httpx.AsyncClient, http: httpx.AsyncClient, make_token: MakeToken
) -> None:
    """Both teams have a contact with the same email: each team's path names its own."""
    acme = await world(client, "acme")
    before = await snapshot(client, acme)
    globex = (await make_token(team="globex")).headers
    twin = ok(await http.post("/contacts", json={"email": "ADA@acme.example"}, headers=globex),
              201)
    segment = ok(await http.post("/segments", json={"name": "Twins"}, headers=globex), 201)
    topic = ok(await http.post("/topics", json={"name": "T", "default_subscription": "opt_out"},
                               headers=globex), 201)

    added = await http.post(f"/contacts/ada@acme.example/segments/{segment['id']}",
                            headers=globex)
    assert ok(added)["id"] == segment["id"]
    listed = ok(await http.get("/contacts/ada@acme.example/segments", headers=globex))
    assert [m["id"] for m in listed["data"]] == [segment["id"]]
    members = ok(await http.get(f"/segments/{segment['id']}/contacts", headers=globex))
    assert [c["id"] for c in members["data"]] == [twin["id"]]
    body = {"topics": [{"id": topic["id"], "subscription": "opt_in"}]}
    chosen = ok(await http.patch("/contacts/ada@acme.example/topics", json=body, headers=globex))
    assert [(t["id"], t["subscription"]) for t in chosen["data"]] == [(topic["id"], "opt_in")]
    topics = ok(await http.get("/contacts/ada@acme.example/topics", headers=globex))
    assert [t["id"] for t in topics["data"]] == [topic["id"]]
    ok(await http.delete(f"/contacts/ada@acme.example/segments/{segment['id']}",
                         headers=globex), 204)
    assert await snapshot(client, acme) == before
