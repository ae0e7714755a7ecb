"""POST /emails with a template sends the template's published version, rendered."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import assert_error
from tests.email.helpers import SENDER, ok, send


@pytest.fixture
def client(client: httpx.AsyncClient, acme_domain: str) -> httpx.AsyncClient:
    return client


async def make_template(
    client: httpx.AsyncClient, *, alias: str = "shipped", publish: bool = True
) -> str:
    created = ok(await client.post("/templates", json={
        "name": "Order shipped", "alias": alias,
        "subject": "Order {{{order}}} shipped", "html": "<p>Hi {{{name}}}</p>",
        "variables": [
            {"key": "order", "type": "string"},
            {"key": "name", "type": "string", "fallback_value": "there"},
        ],
    }), 201)
    template_id: str = created["id"]
    if publish:
        ok(await client.post(f"/templates/{template_id}/publish"))
    return template_id


async def test_the_published_version_is_rendered_with_the_variables(
    client: httpx.AsyncClient,
) -> None:
    template_id = await make_template(client)
    # A later draft is not what is sent: the published version is.
    ok(await client.patch(f"/templates/{template_id}", json={"subject": "Draft {{{order}}}"}))
    email_id = await send(
        client, subject=None, html=None,
        template={"id": template_id, "variables": {"order": "A-7", "name": "<Ada>"}},
    )
    email = ok(await client.get(f"/emails/{email_id}"))
    assert email["subject"] == "Order A-7 shipped"
    assert email["html"] == "<p>Hi &lt;Ada&gt;</p>"


async def test_an_alias_and_a_fallback_work(client: httpx.AsyncClient) -> None:
    await make_template(client)
    email_id = await send(
        client, subject=None, html=None, template={"alias": "shipped", "variables": {"order": "9"}}
    )
    email = ok(await client.get(f"/emails/{email_id}"))
    assert (email["subject"], email["html"]) == ("Order 9 shipped", "<p>Hi there</p>")


async def test_missing_variables_unknown_and_unpublished_templates_are_refused(
    client: httpx.AsyncClient,
) -> None:
    template_id = await make_template(client)
    body = {"from": SENDER, "to": "ada@example.com"}
    missing = await client.post("/emails", json={**body, "template": {"id": template_id}})
    assert "order" in assert_error(missing, 422, "UNPROCESSABLE_ENTITY")
    unknown = await client.post("/emails", json={**body, "template": {"alias": "nope"}})
    assert_error(unknown, 404, "NOT_FOUND")
    draft = await make_template(client, alias="draft", publish=False)
    unpublished = await client.post("/emails", json={**body, "template": {"id": draft}})
    assert "published" in assert_error(unpublished, 422, "UNPROCESSABLE_ENTITY")
    too_long = await client.post("/emails", json={
        **body, "template": {"id": template_id, "variables": {"order": "x" * 5000}}})
    assert "rendered subject" in assert_error(too_long, 422, "UNPROCESSABLE_ENTITY")


async def test_a_template_whose_subject_renders_empty_is_refused(
    client: httpx.AsyncClient,
) -> None:
    """As a subject given directly must hold a character."""
    created = ok(await client.post("/templates", json={
        "name": "Bare", "alias": "bare", "subject": "{{{s}}}", "html": "<p>x</p>",
        "variables": [{"key": "s", "type": "string"}],
    }), 201)
    ok(await client.post(f"/templates/{created['id']}/publish"))
    body = {"from": SENDER, "to": "ada@example.com"}
    for value in ("", "   ", "\n\x01\t", "\u3000"):
        refused = await client.post(
            "/emails", json={**body, "template": {"alias": "bare", "variables": {"s": value}}})
        message = assert_error(refused, 422, "UNPROCESSABLE_ENTITY")
        assert "rendered subject is empty" in message, value
    ok(await client.post(
        "/emails", json={**body, "template": {"alias": "bare", "variables": {"s": " Hi "}}}), 202)
