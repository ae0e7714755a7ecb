"""Template versions: PATCH adds numbered versions based on the current draft,
publish chooses the version sends use, and no route changes a stored version."""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, cast
from uuid import UUID

import asyncpg
import httpx
import pytest
import trio

from tests.conftest import assert_error
from tidings.http.emails import _prepare as prepare_email
from tidings.http.emails_input import SendEmail
from tidings.http.envelope import ApiError
from tidings.http.routing import Call
from tidings.http.templates import detail
from tidings.service import Service
from tidings.storage import templates as template_store

GREETING = {
    "name": "Greeting",
    "alias": "greeting",
    "category": "welcome",
    "from": "Acme <hi@acme.example>",
    "reply_to": "help@acme.example",
    "subject": "Hello {{{NAME}}}",
    "html": "<p>Hello {{{NAME}}}</p>",
    "text": "Hello {{{NAME}}}",
    "variables": [{"key": "NAME", "type": "string", "fallback_value": "friend"}],
}


async def make(client: httpx.AsyncClient, **fields: Any) -> dict[str, Any]:
    created = await client.post("/templates", json={**GREETING, **fields})
    assert created.status_code == 201, created.text
    return await fetch(client, created.json()["data"]["id"])


async def fetch(client: httpx.AsyncClient, ref: str) -> dict[str, Any]:
    response = await client.get(f"/templates/{ref}")
    assert response.status_code == 200, response.text
    template: dict[str, Any] = response.json()["data"]
    return template


async def patch(client: httpx.AsyncClient, ref: str, **fields: Any) -> dict[str, Any]:
    response = await client.patch(f"/templates/{ref}", json=fields)
    assert response.status_code == 200, response.text
    template: dict[str, Any] = response.json()["data"]
    return template


async def versions_table(service: Service) -> list[str]:
    """Every stored version, byte for byte as PostgreSQL renders the row."""
    async with service.db.acquire() as conn:
        rows = await conn.fetch("SELECT v::text AS row FROM template_versions v ORDER BY v.id")
    return [row["row"] for row in rows]


# --- new versions ----------------------------------------------------------------------------


async def test_patch_adds_the_next_version_based_on_the_current_one(
    client: httpx.AsyncClient,
) -> None:
    template = await make(client)
    v1 = template["current_version"]
    updated = await patch(
        client, template["id"], html="<h1>Hi {{{NAME}}}</h1>", change_note="bigger"
    )
    v2 = updated["current_version"]
    assert updated["current_version_number"] == 2
    assert updated["current_version_id"] == v2["id"] != v1["id"]
    assert v2["version_number"] == 2
    assert v2["based_on_version_id"] == v1["id"]
    assert v2["change_note"] == "bigger"
    assert v2["html"] == "<h1>Hi {{{NAME}}}</h1>"
    # Everything not in the PATCH is carried over from the version it is based on.
    for carried in ("subject", "text", "from_email", "from_name", "reply_to_email", "variables"):
        assert v2[carried] == v1[carried], carried

    v3 = (await patch(client, "greeting", subject="Hey {{{NAME}}}"))["current_version"]
    assert (v3["version_number"], v3["based_on_version_id"]) == (3, v2["id"])
    assert v3["html"] == v2["html"] and v3["subject"] == "Hey {{{NAME}}}"
    assert v3["change_note"] is None

    # The earlier versions are still there, unchanged.
    got = await client.get(f"/templates/{template['id']}/versions/{v1['id']}")
    assert got.json() == {"success": True, "data": v1}


async def test_patch_null_clears_optional_content_and_the_text_is_derived_again(
    client: httpx.AsyncClient,
) -> None:
    template = await make(client)
    updated = await patch(client, template["id"], text=None, reply_to=None, **{"from": None})
    version = updated["current_version"]
    assert version["text"] is None
    assert version["subject"] == template["current_version"]["subject"]
    assert version["from_email"] is None and version["from_name"] is None
    assert version["reply_to_email"] is None
    rendered = await client.post(f"/templates/{template['id']}/render")
    assert rendered.json()["data"]["text"] == "Hello friend"


async def test_patch_of_the_templates_own_fields_also_makes_a_version(
    client: httpx.AsyncClient,
) -> None:
    template = await make(client)
    v1 = template["current_version"]
    updated = await patch(client, "greeting", name="Renamed", alias="hello", category=None)
    assert (updated["name"], updated["alias"], updated["category"]) == ("Renamed", "hello", None)
    assert updated["updated_at"] > template["updated_at"]
    # A new draft based on the current one, with the same content.
    v2 = updated["current_version"]
    assert updated["current_version_number"] == v2["version_number"] == 2
    assert updated["current_version_id"] == v2["id"] != v1["id"]
    assert v2["based_on_version_id"] == v1["id"]
    assert v2["change_note"] is None
    same = ("subject", "html", "text", "from_email", "from_name", "reply_to_email", "variables")
    assert {k: v2[k] for k in same} == {k: v1[k] for k in same}
    assert_error(await client.get("/templates/greeting"), 404, "NOT_FOUND")
    assert (await fetch(client, "hello"))["id"] == template["id"]
    # Each one does, with its change note.
    v3 = (await patch(client, "hello", category="alert", change_note="recategorised"))[
        "current_version"
    ]
    assert (v3["version_number"], v3["based_on_version_id"], v3["change_note"]) == (
        3, v2["id"], "recategorised"
    )
    listed = (await client.get("/templates/hello/versions")).json()["data"]["data"]
    assert [v["version_number"] for v in listed] == [3, 2, 1]


async def test_patch_checks_what_it_is_given_and_the_version_it_makes(
    client: httpx.AsyncClient,
) -> None:
    template = await make(client)
    ref = template["id"]
    await make(client, alias="taken")
    message = assert_error(await client.patch(f"/templates/{ref}", json={}), 400, "BAD_REQUEST")
    assert "nothing to change" in message
    # Required content may be changed, not removed.
    for field in ("name", "subject", "html", "variables"):
        message = assert_error(
            await client.patch(f"/templates/{ref}", json={field: None}), 400, "BAD_REQUEST"
        )
        assert f"{field}: " in message and "must not be null" in message, message
    for body in ({"name": "n" * 101}, {"alias": "a b"}, {"category": "spam"},
                 {"from": "nope"}, {"subject": ""}, {"change_note": "c" * 501}):
        message = assert_error(
            await client.patch(f"/templates/{ref}", json=body), 400, "BAD_REQUEST"
        )
        assert next(iter(body)) in message, (body, message)
    # The carried-over html still uses NAME: dropping the variable is refused.
    message = assert_error(
        await client.patch(f"/templates/{ref}", json={"variables": []}), 400, "BAD_REQUEST"
    )
    assert "{{{NAME}}}" in message
    message = assert_error(
        await client.patch(f"/templates/{ref}", json={"alias": "taken"}), 409, "CONFLICT"
    )
    assert "taken" in message
    # With content too: the refused alias leaves no version behind.
    assert_error(
        await client.patch(f"/templates/{ref}", json={"alias": "taken", "html": "<p>x</p>"}),
        409,
        "CONFLICT",
    )
    assert (await fetch(client, ref))["current_version_number"] == 1
    assert_error(await client.patch("/templates/no-such", json={"name": "x"}), 404, "NOT_FOUND")


async def test_versions_are_listed_newest_first_in_pages(client: httpx.AsyncClient) -> None:
    template = await make(client)
    for n in range(2, 5):
        await patch(client, template["id"], change_note=f"v{n}")
    listed = await client.get("/templates/greeting/versions", params={"limit": 3})
    page = listed.json()["data"]
    assert page["object"] == "list" and page["has_more"] is True
    assert [v["version_number"] for v in page["data"]] == [4, 3, 2]
    assert page["data"][0]["object"] == "template_version"
    rest = await client.get(
        f"/templates/{template['id']}/versions", params={"limit": 3, "offset": 3}
    )
    assert [v["version_number"] for v in rest.json()["data"]["data"]] == [1]
    assert rest.json()["data"]["has_more"] is False


async def test_concurrent_patches_get_consecutive_numbers(client: httpx.AsyncClient) -> None:
    template = await make(client)
    async with trio.open_nursery() as nursery:
        for n in range(6):
            change = functools.partial(patch, change_note=f"n{n}")
            nursery.start_soon(change, client, template["id"])
    listed = await client.get(f"/templates/{template['id']}/versions")
    versions = listed.json()["data"]["data"]
    assert [v["version_number"] for v in versions] == [7, 6, 5, 4, 3, 2, 1]
    # Each is based on the one before it.
    for newer, older in zip(versions, versions[1:], strict=False):
        assert newer["based_on_version_id"] == older["id"]


async def test_a_patch_with_an_idempotency_key_makes_one_version(
    client: httpx.AsyncClient,
) -> None:
    template = await make(client)
    headers = {"Idempotency-Key": "patch-once"}
    first = await client.patch(
        f"/templates/{template['id']}", json={"change_note": "once"}, headers=headers
    )
    again = await client.patch(
        f"/templates/{template['id']}", json={"change_note": "once"}, headers=headers
    )
    assert first.status_code == again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.content == first.content
    assert (await fetch(client, template["id"]))["current_version_number"] == 2


# --- publishing ------------------------------------------------------------------------------


async def test_publish_the_current_draft_then_an_earlier_version(
    client: httpx.AsyncClient,
) -> None:
    template = await make(client)
    v1 = template["current_version_id"]
    published = await client.post("/templates/greeting/publish")
    assert published.status_code == 200, published.text
    data = published.json()["data"]
    assert data["status"] == "published"
    assert (data["published_version_id"], data["published_version_number"]) == (v1, 1)
    assert data["published_version"] == data["current_version"]
    assert data["has_unpublished_changes"] is False
    assert data["published_at"].endswith("Z")

    # A new draft does not touch what is published.
    updated = await patch(client, "greeting", html="<p>New {{{NAME}}}</p>")
    assert updated["published_version_id"] == v1
    assert updated["has_unpublished_changes"] is True
    v2 = updated["current_version_id"]

    again = (await client.post(f"/templates/{template['id']}/publish", json={})).json()["data"]
    assert (again["published_version_id"], again["published_version_number"]) == (v2, 2)
    assert again["published_version"]["id"] == v2
    assert again["published_version"] == again["current_version"]
    assert again["has_unpublished_changes"] is False
    # published_at moves to this publish: after the first one, and after version 2 was made.
    published_at = datetime.fromisoformat(again["published_at"])
    assert published_at > datetime.fromisoformat(data["published_at"])
    assert published_at > datetime.fromisoformat(updated["current_version"]["created_at"])
    assert await fetch(client, "greeting") == again

    # Back to version 1 by naming it; publishing it twice keeps its published_at.
    back = await client.post("/templates/greeting/publish", json={"version_id": v1})
    assert back.status_code == 200, back.text
    back_data = back.json()["data"]
    assert back_data["published_version_number"] == 1
    assert back_data["current_version_id"] == v2  # the draft stays the newest version
    twice = await client.post("/templates/greeting/publish", json={"version_id": v1})
    assert twice.json()["data"]["published_at"] == back_data["published_at"]


async def test_a_publish_that_meets_a_patch_in_flight_publishes_its_version(
    client: httpx.AsyncClient, service: Service
) -> None:
    template = await make(client)
    answers: list[httpx.Response] = []

    async def publish() -> None:
        answers.append(await client.post(f"/templates/{template['id']}/publish"))

    async with trio.open_nursery() as nursery:
        async with service.db.acquire() as conn, conn.transaction():
            # A PATCH between its lock and its commit: version 2 made current.
            locked = await conn.fetchrow(
                "SELECT id FROM templates WHERE id = $1 FOR UPDATE", UUID(template["id"]))
            assert locked is not None
            await conn.execute(
                "INSERT INTO template_versions (template_id, team_id, version_number, subject,"
                " html, variables, based_on_version_id)"
                " SELECT template_id, team_id, 2, subject, '<p>Two</p>', variables, id"
                " FROM template_versions WHERE id = $1",
                UUID(template["current_version_id"]))
            await conn.execute(
                "UPDATE templates SET current_version_id = (SELECT id FROM template_versions"
                " WHERE template_id = $1 AND version_number = 2) WHERE id = $1",
                UUID(template["id"]))
            nursery.start_soon(publish)
            await trio.sleep(0.3)
            assert answers == []  # waits for the PATCH
    [published] = answers
    assert published.status_code == 200, published.text
    assert published.json()["data"]["published_version_number"] == 2


class DeletesAfterFirstRead:
    """A connection on which the template is deleted, on another connection,
    just after the first row is read: a DELETE racing a request's two reads."""

    def __init__(self, conn: Any, service: Service, template_id: UUID) -> None:
        self._conn, self._service, self._template_id = conn, service, template_id
        self.raced = False

    async def fetchrow(self, query: str, *args: object) -> Any:
        row = await self._conn.fetchrow(query, *args)
        if not self.raced:
            self.raced = True
            async with self._service.db.acquire() as other:
                await other.execute("DELETE FROM templates WHERE id = $1", self._template_id)
        return row

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


async def test_a_template_deleted_between_a_requests_reads_is_404(
    client: httpx.AsyncClient, service: Service
) -> None:
    for use in ("detail", "send"):
        template = await make(client, alias=None, name=f"Gone {use}")
        assert (await client.post(f"/templates/{template['id']}/publish")).status_code == 200
        template_id = UUID(template["id"])
        async with service.db.acquire() as conn:
            team_id = await conn.fetchval("SELECT team_id FROM templates WHERE id = $1",
                                          template_id)
            racing = DeletesAfterFirstRead(conn, service, template_id)
            call = Call(service, cast(Any, SimpleNamespace(team_id=team_id)), cast(Any, racing))
            with pytest.raises(ApiError) as refused:
                if use == "detail":
                    found = await template_store.get_template(
                        call.conn, team_id, template_store.TemplateRef(id=template_id))
                    assert found is not None
                    await detail(call, found)
                else:
                    body = SendEmail.model_validate({
                        "from": "hi@acme.example", "to": "ada@example.com",
                        "template": {"id": str(template_id)}})
                    await prepare_email(call, body, datetime.now(UTC))
        assert racing.raced
        assert (refused.value.status, refused.value.message) == (404, "template not found")


async def test_publishing_a_version_of_another_template_is_404(
    client: httpx.AsyncClient,
) -> None:
    mine = await make(client)
    other = await make(client, alias="other")
    response = await client.post(
        f"/templates/{mine['id']}/publish", json={"version_id": other["current_version_id"]}
    )
    message = assert_error(response, 404, "NOT_FOUND")
    assert "version" in message
    assert (await fetch(client, mine["id"]))["published_version_id"] is None
    assert (await fetch(client, "other"))["published_version_id"] is None
    assert_error(await client.post("/templates/no-such/publish"), 404, "NOT_FOUND")
    message = assert_error(
        await client.post(f"/templates/{mine['id']}/publish", json={"version_id": "x"}),
        400,
        "BAD_REQUEST",
    )
    assert "version_id" in message


# --- immutability ---------------------------------------------------------------------------


async def test_no_route_changes_a_stored_version(
    client: httpx.AsyncClient, service: Service
) -> None:
    template = await make(client)
    ref = template["id"]
    v1 = template["current_version_id"]
    other = await make(client, alias="other")
    before = await versions_table(service)
    v1_json = (await client.get(f"/templates/{ref}/versions/{v1}")).content

    await patch(client, ref, html="<p>changed {{{NAME}}}</p>", subject="changed")
    await patch(client, ref, name="renamed", alias="renamed", category="alert")
    await patch(client, ref, variables=[{"key": "NAME", "type": "string"}])
    assert (await client.post(f"/templates/{ref}/publish")).status_code == 200
    assert (
        await client.post(f"/templates/{ref}/publish", json={"version_id": v1})
    ).status_code == 200
    assert (
        await client.post(f"/templates/{ref}/render", json={"variables": {"NAME": "x"}})
    ).status_code == 200
    assert (await client.get(f"/templates/{ref}/versions")).status_code == 200
    assert (await client.get("/templates")).status_code == 200
    assert (await client.delete(f"/templates/{other['id']}")).status_code == 204
    assert (await client.patch(f"/templates/{ref}", json={"alias": "x y"})).status_code == 400

    after = await versions_table(service)
    other_rows = [row for row in before if other["current_version_id"] in row]
    assert [row for row in before if row not in other_rows] == [
        row for row in after if row in before
    ]
    assert len(after) == len(before) - 1 + 3  # three changes, one deletion
    assert (await client.get(f"/templates/{ref}/versions/{v1}")).content == v1_json


async def test_the_database_refuses_to_update_a_version(
    client: httpx.AsyncClient, service: Service
) -> None:
    template = await make(client)
    async with service.db.acquire() as conn:
        for statement in (
            "UPDATE template_versions SET html = 'tampered'",
            "UPDATE template_versions SET change_note = 'note'",
            "UPDATE template_versions SET version_number = 9",
        ):
            with pytest.raises(asyncpg.RestrictViolationError, match="immutable"):
                await conn.execute(statement)
    assert (await fetch(client, template["id"]))["current_version"] == template[
        "current_version"
    ]
