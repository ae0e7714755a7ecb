"""Broadcast routes: fields, drafts, revision, permissions, other teams, checks."""

from __future__ import annotations

import httpx

from tests.broadcasts.conftest import Audience, draft
from tests.conftest import MakeToken, assert_error
from tests.email.helpers import ok

FIELDS = {
    "id", "team_id", "name", "status", "segment_id", "topic_id", "from_email", "from_name",
    "reply_to_email", "subject", "preview_text", "html", "text", "variable_bindings",
    "scheduled_at", "queued_at", "sent_at", "canceled_at", "audience_count", "eligible_count",
    "suppressed_count", "queued_count", "failed_count", "revision", "created_at", "updated_at",
}


async def test_create_shows_every_field_as_a_draft_at_revision_1(
    client: httpx.AsyncClient, audience: Audience
) -> None:
    created = ok(await client.post("/broadcasts", json=draft(audience)), 201)
    assert FIELDS <= set(created)
    assert created["status"] == "draft" and created["revision"] == 1
    assert created["topic_id"] is None and created["scheduled_at"] is None
    assert created["queued_count"] == 0 and created["variable_bindings"]["promo"] == "20% off"
    assert ok(await client.get(f"/broadcasts/{created['id']}")) == created


async def test_list_pages_newest_first(client: httpx.AsyncClient, audience: Audience) -> None:
    ids = [ok(await client.post("/broadcasts", json=draft(audience, name=f"b{n}")), 201)["id"]
           for n in range(3)]
    first = ok(await client.get("/broadcasts", params={"limit": 2}))
    assert first["object"] == "list" and first["has_more"] is True
    assert [b["id"] for b in first["data"]] == ids[::-1][:2]
    rest = ok(await client.get("/broadcasts", params={"limit": 2, "offset": 2}))
    assert rest["has_more"] is False and [b["id"] for b in rest["data"]] == [ids[0]]


async def test_patch_bumps_revision_and_refuses_a_stale_one(
    client: httpx.AsyncClient, audience: Audience
) -> None:
    b = ok(await client.post("/broadcasts", json=draft(audience)), 201)
    changed = ok(
        await client.patch(f"/broadcasts/{b['id']}", json={"name": "New", "revision": 1})
    )
    assert changed["name"] == "New" and changed["revision"] == 2
    again = ok(await client.patch(f"/broadcasts/{b['id']}", json={"subject": "Hi"}))
    assert again["revision"] == 3 and again["name"] == "New"
    stale = await client.patch(f"/broadcasts/{b['id']}", json={"name": "Old", "revision": 2})
    assert "stale" in assert_error(stale, 409, "CONFLICT")
    assert ok(await client.get(f"/broadcasts/{b['id']}"))["name"] == "New"


async def test_checks_of_what_a_broadcast_refers_to(
    client: httpx.AsyncClient, audience: Audience
) -> None:
    unverified = await client.post(
        "/broadcasts", json=draft(audience, from_email="a@other.example")
    )
    assert "verified" in assert_error(unverified, 422, "UNPROCESSABLE_ENTITY")
    for subject in ("a\nb", "a\u000bb", "a\u2028b", "a\u0085b"):
        controlled = await client.post("/broadcasts", json=draft(audience, subject=subject))
        message = assert_error(controlled, 400, "BAD_REQUEST")
        assert "subject: control characters are not allowed" in message, subject
    # No address at all is malformed (400), as in every other route.
    for field in ("from_email", "reply_to_email"):
        body = draft(audience, **{field: "not an email"})
        malformed = await client.post("/broadcasts", json=body)
        assert assert_error(malformed, 400, "BAD_REQUEST").startswith(f"{field}:"), field
    segment = await client.post(
        "/broadcasts", json=draft(audience, segment_id="00000000-0000-4000-8000-000000000000")
    )
    assert "segment_id" in assert_error(segment, 404, "NOT_FOUND")
    topic = await client.post(
        "/broadcasts", json=draft(audience, topic_id="00000000-0000-4000-8000-000000000000")
    )
    assert "topic_id" in assert_error(topic, 404, "NOT_FOUND")
    unknown = await client.post("/broadcasts", json=draft(audience, html="<p>{{{nope}}}</p>"))
    assert assert_error(unknown, 422, "UNPROCESSABLE_ENTITY").startswith("html: ")
    in_subject = await client.post("/broadcasts", json=draft(audience, subject="Hi {{{zzz}}}"))
    message = assert_error(in_subject, 422, "UNPROCESSABLE_ENTITY")
    assert message.startswith("subject: ") and "{{{zzz}}}" in message
    body = draft(audience)
    del body["html"]
    assert "html" in assert_error(await client.post("/broadcasts", json=body), 400, "BAD_REQUEST")


async def test_permissions(
    base_url: str, make_token: MakeToken, client: httpx.AsyncClient, audience: Audience
) -> None:
    b = ok(await client.post("/broadcasts", json=draft(audience)), 201)
    reader = await make_token(team="acme", permissions=["broadcasts:read"])
    writer = await make_token(team="acme", permissions=["broadcasts:read", "broadcasts:write"])
    async with httpx.AsyncClient(base_url=base_url, headers=reader.headers) as c:
        ok(await c.get(f"/broadcasts/{b['id']}"))
        assert_error(await c.post("/broadcasts", json=draft(audience)), 403, "FORBIDDEN")
        assert_error(await c.patch(f"/broadcasts/{b['id']}", json={"name": "x"}), 403, "FORBIDDEN")
    async with httpx.AsyncClient(base_url=base_url, headers=writer.headers) as c:
        ok(await c.patch(f"/broadcasts/{b['id']}", json={"name": "x"}))
        assert_error(await c.post(f"/broadcasts/{b['id']}/send"), 403, "FORBIDDEN")
        assert_error(await c.post(f"/broadcasts/{b['id']}/cancel"), 403, "FORBIDDEN")


async def test_another_teams_broadcast_is_not_found(
    base_url: str, make_token: MakeToken, client: httpx.AsyncClient, audience: Audience
) -> None:
    b = ok(await client.post("/broadcasts", json=draft(audience)), 201)
    other = await make_token(team="globex")
    async with httpx.AsyncClient(base_url=base_url, headers=other.headers) as c:
        path = f"/broadcasts/{b['id']}"
        assert_error(await c.get(path), 404, "NOT_FOUND")
        assert_error(await c.patch(path, json={"name": "x"}), 404, "NOT_FOUND")
        assert_error(await c.delete(path), 404, "NOT_FOUND")
        assert_error(await c.post(f"{path}/send"), 404, "NOT_FOUND")
        assert_error(await c.post(f"{path}/cancel"), 404, "NOT_FOUND")
        assert ok(await c.get("/broadcasts"))["data"] == []


async def test_header_fields_refuse_line_breaks(
    client: httpx.AsyncClient, audience: Audience
) -> None:
    """from_name and subject become the From and Subject headers: a line
    break in either would write headers of the sender's choosing."""
    for field, value in (("from_name", "Evil\r\nBcc: victim@x.example"), ("from_name", "A\rB"),
                         ("from_name", "Tab\tName"), ("subject", "s\r\nX-Inj: 1"),
                         ("subject", "two\nlines"), ("from_name", "News\u2028Team"),
                         ("from_name", "News\u2029Team"), ("from_name", "News\x85Team")):
        created = await client.post("/broadcasts", json=draft(audience, **{field: value}))
        assert assert_error(created, 400, "BAD_REQUEST").startswith(f"invalid body: {field}")
    b = ok(await client.post("/broadcasts", json=draft(audience)), 201)
    patched = await client.patch(f"/broadcasts/{b['id']}", json={"from_name": "X\nBcc: y@z.io"})
    assert "from_name" in assert_error(patched, 400, "BAD_REQUEST")
    assert ok(await client.get(f"/broadcasts/{b['id']}"))["revision"] == 1


async def test_numbers_json_cannot_hold_are_400(
    client: httpx.AsyncClient, audience: Audience
) -> None:
    b = ok(await client.post("/broadcasts", json=draft(audience)), 201)
    for number in ("NaN", "Infinity", "-Infinity", "1e400", "-1" + "0" * 400):
        raw = '{"variable_bindings": {"v": ' + number + "}}"
        response = await client.patch(
            f"/broadcasts/{b['id']}", content=raw, headers={"Content-Type": "application/json"}
        )
        assert "variable_bindings" in assert_error(response, 400, "BAD_REQUEST"), number


async def test_the_schema_of_a_change_says_which_fields_take_null(
    client: httpx.AsyncClient, audience: Audience
) -> None:
    """Fields a broadcast cannot be without may be left out of a PATCH, not
    nulled (400); the schema says so rather than offering null."""
    response = await client.get("/openapi.json")
    assert response.status_code == 200
    schema = response.json()
    fields = schema["components"]["schemas"]["UpdateBroadcast"]["properties"]
    for name in ("name", "segment_id", "from_email", "subject", "html", "variable_bindings"):
        assert "null" not in str(fields[name]), name
    assert {"type": "null"} in fields["from_name"]["anyOf"]
    b = ok(await client.post("/broadcasts", json=draft(audience)), 201)
    nulled = await client.patch(f"/broadcasts/{b['id']}", json={"html": None})
    assert "html" in assert_error(nulled, 400, "BAD_REQUEST")
    empty = await client.patch(f"/broadcasts/{b['id']}", json={"subject": ""})
    assert assert_error(empty, 400, "BAD_REQUEST").startswith("invalid body: subject: ")
