"""POST /templates/{template}/render: a preview of what a send would get."""

from __future__ import annotations

from typing import Any

import httpx

from tests.conftest import assert_error

ORDER = {
    "name": "Order shipped",
    "alias": "shipped",
    "subject": "{{{NAME}}}, order {{{ORDER}}} is on its way",
    "html": (
        "<html><head><style>p {margin: 0}</style></head><body>"
        "<h1>Hi {{{NAME}}}</h1><p>Order {{{ORDER}}} ships {{{ITEMS}}} items."
        "<br>Gift: {{{GIFT}}}</p>"
        '<p><a href="https://shop.example/track/{{{ORDER}}}">Track it</a></p></body></html>'
    ),
    "variables": [
        {"key": "NAME", "type": "string", "fallback_value": "there"},
        {"key": "ORDER", "type": "string"},
        {"key": "ITEMS", "type": "number"},
        {"key": "GIFT", "type": "boolean", "fallback_value": False},
    ],
}


async def make(client: httpx.AsyncClient, **fields: Any) -> dict[str, Any]:
    created = await client.post("/templates", json={**ORDER, **fields})
    assert created.status_code == 201, created.text
    template: dict[str, Any] = (
        await client.get(f"/templates/{created.json()['data']['id']}")
    ).json()["data"]
    return template


async def render(
    client: httpx.AsyncClient, ref: str, variables: dict[str, Any] | None = None, **extra: Any
) -> httpx.Response:
    body = dict(extra)
    if variables is not None:
        body["variables"] = variables
    return await client.post(f"/templates/{ref}/render", json=body)


async def test_render_substitutes_values_and_fallbacks(client: httpx.AsyncClient) -> None:
    template = await make(client)
    response = await render(client, "shipped", {"ORDER": "A-17", "ITEMS": 3})
    assert response.status_code == 200, response.text
    assert response.json()["data"] == {
        "subject": "there, order A-17 is on its way",
        "html": (
            "<html><head><style>p {margin: 0}</style></head><body>"
            "<h1>Hi there</h1><p>Order A-17 ships 3 items.<br>Gift: false</p>"
            '<p><a href="https://shop.example/track/A-17">Track it</a></p></body></html>'
        ),
        "text": (
            "Hi there\n\nOrder A-17 ships 3 items.\nGift: false\n\n"
            "Track it (https://shop.example/track/A-17)"
        ),
        "version_id": template["current_version_id"],
        "version_number": 1,
    }


async def test_html_values_are_escaped_subject_and_text_are_not(
    client: httpx.AsyncClient,
) -> None:
    await make(client)
    name = '<img src=x onerror="alert(1)"> & Co'
    response = await render(client, "shipped", {"NAME": name, "ORDER": "1", "ITEMS": 1})
    data = response.json()["data"]
    assert "<img" not in data["html"]
    assert "<h1>Hi &lt;img src=x onerror=&quot;alert(1)&quot;&gt; &amp; Co</h1>" in data["html"]
    assert data["subject"].startswith(name + ",")
    assert data["text"].startswith("Hi " + name)


async def test_missing_values_are_422_naming_every_key(client: httpx.AsyncClient) -> None:
    await make(client)
    bodies: list[dict[str, Any]] = [{}, {"variables": {}}]
    for body in bodies:
        response = await client.post("/templates/shipped/render", json=body)
        message = assert_error(response, 422, "UNPROCESSABLE_ENTITY")
        assert "ORDER, ITEMS" in message
        assert "NAME" not in message and "GIFT" not in message
    # No body at all is the same as {}.
    message = assert_error(
        await client.post("/templates/shipped/render"), 422, "UNPROCESSABLE_ENTITY"
    )
    assert "ORDER, ITEMS" in message


async def test_wrong_types_and_undeclared_keys_are_422(client: httpx.AsyncClient) -> None:
    await make(client)
    response = await render(
        client, "shipped", {"ORDER": 17, "ITEMS": True, "GIFT": "yes", "COUPON": "X"}
    )
    message = assert_error(response, 422, "UNPROCESSABLE_ENTITY")
    assert "ORDER must be a string, got number" in message
    assert "ITEMS must be a number, got boolean" in message
    assert "GIFT must be a boolean, got string" in message
    assert "not declared by the template: COUPON" in message
    response = await render(client, "shipped", {"ORDER": "1", "ITEMS": None})
    assert "ITEMS must be a number, got null" in assert_error(
        response, 422, "UNPROCESSABLE_ENTITY"
    )
    # A whole number beyond a double's range is no JSON number (docs/api.md).
    huge = await client.post("/templates/shipped/render", content=(
        '{"variables": {"ORDER": "1", "ITEMS": 1' + "0" * 400 + "}}"),
        headers={"Content-Type": "application/json"})
    assert "variables: must hold only finite numbers" in assert_error(
        huge, 400, "BAD_REQUEST")
    message = assert_error(
        await client.post("/templates/shipped/render", json={"variables": []}),
        400,
        "BAD_REQUEST",
    )
    assert "variables" in message


async def test_the_default_version_is_the_published_one_else_the_draft(
    client: httpx.AsyncClient,
) -> None:
    template = await make(client, html="<p>one</p>", variables=[], subject="s")
    v1 = template["current_version_id"]
    first = await render(client, "shipped")
    assert (first.json()["data"]["html"], first.json()["data"]["version_id"]) == (
        "<p>one</p>", v1
    )
    await client.patch("/templates/shipped", json={"html": "<p>two</p>"})
    draft = (await render(client, "shipped")).json()["data"]
    assert (draft["html"], draft["version_number"]) == ("<p>two</p>", 2)
    assert (
        await client.post("/templates/shipped/publish", json={"version_id": v1})
    ).status_code == 200
    published = (await render(client, "shipped")).json()["data"]
    assert (published["html"], published["version_id"]) == ("<p>one</p>", v1)
    chosen = (
        await render(client, template["id"], version_id=draft["version_id"])
    ).json()["data"]
    assert chosen["html"] == "<p>two</p>"


async def test_a_version_of_another_template_does_not_render(client: httpx.AsyncClient) -> None:
    await make(client)
    other = await make(client, alias="other")
    response = await render(client, "shipped", version_id=other["current_version_id"])
    assert_error(response, 404, "NOT_FOUND")
    assert_error(await render(client, "nothing-here"), 404, "NOT_FOUND")


async def test_a_given_text_part_is_used_instead_of_a_derived_one(
    client: httpx.AsyncClient,
) -> None:
    await make(client, text="Order {{{ORDER}}} <raw> & {{{NAME}}}")
    response = await render(client, "shipped", {"ORDER": "<9>", "ITEMS": 1})
    assert response.json()["data"]["text"] == "Order <9> <raw> & there"


async def test_a_render_over_the_size_limit_is_422_naming_the_limit(
    client: httpx.AsyncClient,
) -> None:
    await make(
        client, alias="big", subject="s", html="<p>{{{A}}}</p>" * 1000,
        variables=[{"key": "A", "type": "string"}],
    )
    # Each "<" is "&lt;" in the html: 4.4 MB of html from a 1 KB value.
    response = await render(client, "big", {"A": "<" * 1100})
    message = assert_error(response, 422, "UNPROCESSABLE_ENTITY")
    assert "over the limit of 4194304 bytes (4 MiB)" in message
    response = await render(client, "big", {"A": "<" * 10})
    assert response.status_code == 200, response.text


async def test_entity_encoded_braces_are_shown_not_filled(client: httpx.AsyncClient) -> None:
    # The html shows "{{{X}}}" literally: it is no placeholder and needs no variable.
    await make(client, alias="braces", subject="s", variables=[],
               html="<p>Write &#123;&#123;&#123;X}}} in a template</p>")
    response = await render(client, "braces")
    assert response.status_code == 200, response.text
    assert response.json()["data"]["text"] == "Write {{{X}}} in a template"
    # With X declared, the derived text fills the real placeholder only, as the html does.
    await make(client, alias="both", subject="s",
               html="<p>&#123;&#123;&#123;X}}} is {{{X}}}</p>",
               variables=[{"key": "X", "type": "string"}])
    data = (await render(client, "both", {"X": "Ada"})).json()["data"]
    assert data["html"] == "<p>&#123;&#123;&#123;X}}} is Ada</p>"
    assert data["text"] == "{{{X}}} is Ada"
