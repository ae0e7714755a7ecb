"""POST /templates and the template record: the creation input's limits, the
create response, retrieval by id or alias, listing, deletion, alias uniqueness
and team isolation."""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from tests.conftest import Credential, MakeToken, assert_error

MINIMAL = {"name": "Welcome", "subject": "Welcome aboard", "html": "<p>Hello</p>"}


async def create(client: httpx.AsyncClient, **fields: Any) -> httpx.Response:
    return await client.post("/templates", json={**MINIMAL, **fields})


async def created_id(client: httpx.AsyncClient, **fields: Any) -> str:
    response = await create(client, **fields)
    assert response.status_code == 201, response.text
    template_id: str = response.json()["data"]["id"]
    return template_id


def variables(count: int) -> list[dict[str, Any]]:
    return [{"key": f"V{i}", "type": "string", "fallback_value": "x"} for i in range(count)]


# --- the create response ---------------------------------------------------------------


async def test_create_answers_201_with_object_and_id_only(client: httpx.AsyncClient) -> None:
    response = await create(client)
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["success"] is True
    assert set(body["data"]) == {"object", "id"}
    assert body["data"]["object"] == "template"
    uuid.UUID(body["data"]["id"])


async def test_create_makes_draft_version_1_with_the_given_content(
    client: httpx.AsyncClient, acme: Credential
) -> None:
    template_id = await created_id(
        client,
        name="Receipt",
        alias="receipt",
        category="receipt",
        subject="Your receipt, {{{NAME}}}",
        html="<p>Total: {{{TOTAL}}}</p>",
        text="Total: {{{TOTAL}}}",
        reply_to="help@acme.example",
        variables=[
            {"key": "NAME", "type": "string", "fallback_value": "friend"},
            {"key": "TOTAL", "type": "number"},
        ],
        **{"from": "Acme Billing <billing@acme.example>"},
    )
    response = await client.get(f"/templates/{template_id}")
    assert response.status_code == 200, response.text
    template = response.json()["data"]
    assert template["object"] == "template"
    assert template["id"] == template_id
    assert template["team_id"] == str(acme.team_id)
    assert (template["name"], template["alias"], template["category"]) == (
        "Receipt", "receipt", "receipt"
    )
    assert template["status"] == "draft"
    assert template["current_version_number"] == 1
    assert template["published_version_id"] is None
    assert template["published_version_number"] is None
    assert template["published_at"] is None
    assert template["has_unpublished_changes"] is True
    assert template["published_version"] is None
    version = template["current_version"]
    assert version["id"] == template["current_version_id"]
    assert version == {
        "object": "template_version",
        "id": version["id"],
        "team_id": str(acme.team_id),
        "template_id": template_id,
        "version_number": 1,
        "subject": "Your receipt, {{{NAME}}}",
        "html": "<p>Total: {{{TOTAL}}}</p>",
        "text": "Total: {{{TOTAL}}}",
        "variables": [
            {"key": "NAME", "type": "string", "fallback_value": "friend"},
            {"key": "TOTAL", "type": "number", "fallback_value": None},
        ],
        "created_at": version["created_at"],
        "from_email": "billing@acme.example",
        "from_name": "Acme Billing",
        "reply_to_email": "help@acme.example",
        "based_on_version_id": None,
        "change_note": None,
    }
    assert version["created_at"].endswith("Z")


async def test_name_subject_and_html_are_required(client: httpx.AsyncClient) -> None:
    template_id = await created_id(client)
    version = (await client.get(f"/templates/{template_id}")).json()["data"]["current_version"]
    assert version["subject"] == "Welcome aboard"
    assert version["from_email"] is None and version["from_name"] is None
    assert version["text"] is None
    assert version["variables"] == []
    for missing in ("name", "subject", "html"):
        body = {k: v for k, v in MINIMAL.items() if k != missing}
        message = assert_error(await client.post("/templates", json=body), 400, "BAD_REQUEST")
        assert f"{missing}: is required" in message


# --- the creation input's limits -----------------------------------------------------------


async def test_name_is_1_to_100_characters(client: httpx.AsyncClient) -> None:
    assert (await create(client, name="n")).status_code == 201
    assert (await create(client, name="n" * 100)).status_code == 201
    for bad in ("", "n" * 101):
        message = assert_error(await create(client, name=bad), 400, "BAD_REQUEST")
        assert "name" in message


async def test_alias_is_at_most_100_of_letters_digits_dash_underscore(
    client: httpx.AsyncClient,
) -> None:
    assert (await create(client, alias="a" * 100)).status_code == 201
    assert (await create(client, alias="Order_Shipped-2")).status_code == 201
    for bad in ("a" * 101, "", "has space", "dot.ted", "slash/ed", "ümlaut", "semi;colon"):
        message = assert_error(await create(client, alias=bad), 400, "BAD_REQUEST")
        assert "alias" in message, (bad, message)


async def test_alias_may_not_look_like_a_uuid(client: httpx.AsyncClient) -> None:
    # Paths take an id or an alias; an alias that parses as a UUID would be ambiguous.
    for bad in (str(uuid.uuid4()), uuid.uuid4().hex):
        message = assert_error(await create(client, alias=bad), 400, "BAD_REQUEST")
        assert "alias" in message and "UUID" in message


async def test_category_is_one_of_six(client: httpx.AsyncClient) -> None:
    for category in ("otp", "welcome", "receipt", "alert", "notification", "custom"):
        assert (await create(client, category=category)).status_code == 201, category
    for bad in ("marketing", "OTP", "", 1):
        message = assert_error(await create(client, category=bad), 400, "BAD_REQUEST")
        assert "category" in message


async def test_from_is_an_address_with_an_optional_display_name(
    client: httpx.AsyncClient,
) -> None:
    accepted = {
        "hi@acme.example": ("hi@acme.example", None),
        "Acme <hi@acme.example>": ("hi@acme.example", "Acme"),
        '"Acme, Inc." <hi@acme.example>': ("hi@acme.example", "Acme, Inc."),
        "Ünïcode Näme <hi@acme.example>": ("hi@acme.example", "Ünïcode Näme"),
        '"Acme (EU)" <hi@acme.example>': ("hi@acme.example", "Acme (EU)"),
        '"Acme \\"(x)\\"" <hi@acme.example>': ("hi@acme.example", 'Acme "(x)"'),
    }
    for value, (email, name) in accepted.items():
        template_id = await created_id(client, **{"from": value})
        version = (await client.get(f"/templates/{template_id}")).json()["data"][
            "current_version"
        ]
        assert (version["from_email"], version["from_name"]) == (email, name), value
    refused = [
        "not an address",
        "hi@",
        "a@acme.example, b@acme.example",
        "Acme <hi@acme.example> trailing",
        "hi@acme.example <other@evil.example>",
        "Acme\r\nBcc: x@evil.example <hi@acme.example>",
        "",
        # RFC 5322 comments: the parser would drop them without a word.
        "hi@acme.example (Acme)",
        "Acme (the shop) <hi@acme.example>",
        "Acme <hi@acme.example> (x)",
        "Acme <hi(x)@acme.example>",
        # Inputs on which the standard library's parser fails internally.
        "Acme@[ ",
        ':Zr@.J8,>;{7;^><',
        '.:"Vd[Hd-',
    ]
    for value in refused:
        message = assert_error(await create(client, **{"from": value}), 400, "BAD_REQUEST")
        assert "from" in message, (value, message)


async def test_a_comment_in_from_is_refused_naming_it(client: httpx.AsyncClient) -> None:
    response = await create(client, **{"from": "hi@acme.example (Acme)"})
    message = assert_error(response, 400, "BAD_REQUEST")
    assert "from" in message and "comments in parentheses are not allowed" in message


async def test_reply_to_is_one_address_without_a_display_name(
    client: httpx.AsyncClient,
) -> None:
    template_id = await created_id(client, reply_to="Help@Acme.Example")
    version = (await client.get(f"/templates/{template_id}")).json()["data"]["current_version"]
    assert version["reply_to_email"] == "Help@acme.example"
    # Only the address would be kept: a display name would be lost without a word.
    for value in ("Acme <help@acme.example>", '"Acme" <help@acme.example>',
                  "help@acme.example (Acme)", "a@acme.example, b@acme.example", "help@", ""):
        message = assert_error(await create(client, reply_to=value), 400, "BAD_REQUEST")
        assert "reply_to" in message and "display name" in message, (value, message)
        response = await client.patch(f"/templates/{template_id}", json={"reply_to": value})
        assert "reply_to" in assert_error(response, 400, "BAD_REQUEST"), value
    assert (await client.get(f"/templates/{template_id}")).json()["data"][
        "current_version_number"
    ] == 1


async def test_from_is_at_most_255_characters_display_name_included(
    client: httpx.AsyncClient,
) -> None:
    address = " <hi@acme.example>"
    at_limit = "N" * (255 - len(address)) + address
    assert len(at_limit) == 255
    template_id = await created_id(client, **{"from": at_limit})
    version = (await client.get(f"/templates/{template_id}")).json()["data"]["current_version"]
    assert version["from_name"] == "N" * (255 - len(address))
    over = "N" + at_limit
    message = assert_error(await create(client, **{"from": over}), 400, "BAD_REQUEST")
    assert "from" in message and "255" in message


async def test_subject_is_a_string_of_at_least_one_character_and_one_line(
    client: httpx.AsyncClient,
) -> None:
    assert (await create(client, subject="S")).status_code == 201
    for bad in ("", "two\nlines", None):
        message = assert_error(await create(client, subject=bad), 400, "BAD_REQUEST")
        assert "subject" in message


async def test_at_most_50_variables(client: httpx.AsyncClient) -> None:
    template_id = await created_id(client, variables=variables(50))
    version = (await client.get(f"/templates/{template_id}")).json()["data"]["current_version"]
    assert len(version["variables"]) == 50
    message = assert_error(await create(client, variables=variables(51)), 400, "BAD_REQUEST")
    assert "variables" in message and "50" in message


async def test_variable_keys_types_and_fallbacks_are_checked(client: httpx.AsyncClient) -> None:
    ok = [
        {"key": "S", "type": "string", "fallback_value": ""},
        {"key": "N", "type": "number", "fallback_value": 2.5},
        {"key": "I", "type": "number", "fallback_value": 3},
        {"key": "B", "type": "boolean", "fallback_value": False},
        {"key": "NONE", "type": "string", "fallback_value": None},
        {"key": "ABSENT", "type": "string"},
    ]
    assert (await create(client, variables=ok)).status_code == 201
    cases = [
        ([{"key": "A", "type": "string"}, {"key": "A", "type": "number"}], "duplicate key 'A'"),
        ([{"key": "N", "type": "number", "fallback_value": "3"}], "variables.0.fallback_value"),
        ([{"key": "N", "type": "number", "fallback_value": True}], "got boolean"),
        ([{"key": "B", "type": "boolean", "fallback_value": 1}], "variables.0.fallback_value"),
        ([{"key": "S", "type": "string", "fallback_value": 1}], "variables.0.fallback_value"),
        ([{"key": "S", "type": "date"}], "variables.0.type"),
        ([{"key": "has space", "type": "string"}], "variables.0.key"),
        ([{"key": "", "type": "string"}], "variables.0.key"),
        ([{"key": "S"}], "variables.0.type"),
        ([{"key": "S", "type": "string", "fallback_value": {"a": 1}}], "fallback_value"),
    ]
    for declared, expected in cases:
        message = assert_error(await create(client, variables=declared), 400, "BAD_REQUEST")
        assert expected in message, (declared, message)


async def test_a_fallback_equal_to_a_valid_one_but_of_another_type_is_refused_every_time(
    client: httpx.AsyncClient,
) -> None:
    """``True == 1`` in Python: content checked once (and compiled) must not
    let the same content with a boolean fallback for a number through, on
    create or on PATCH."""
    html = "<p>{{{N}}}</p>"
    number = [{"key": "N", "type": "number", "fallback_value": 1}]
    boolean = [{"key": "N", "type": "number", "fallback_value": True}]
    template_id = await created_id(client, html=html, variables=number)
    message = assert_error(await create(client, html=html, variables=boolean), 400, "BAD_REQUEST")
    assert "variables.0.fallback_value" in message and "got boolean" in message
    patched = await client.patch(f"/templates/{template_id}", json={"variables": boolean})
    assert "got boolean" in assert_error(patched, 400, "BAD_REQUEST")
    stored = (await client.get(f"/templates/{template_id}")).json()["data"]["current_version"]
    assert stored["version_number"] == 1
    assert stored["variables"][0]["fallback_value"] == 1
    assert stored["variables"][0]["fallback_value"] is not True


async def test_placeholders_must_name_declared_variables(client: httpx.AsyncClient) -> None:
    declared = [{"key": "NAME", "type": "string"}]
    assert (
        await create(client, html="<p>{{{NAME}}} {{{ NAME }}}</p>", variables=declared)
    ).status_code == 201
    for field in ("subject", "html", "text"):
        message = assert_error(
            await create(client, variables=declared, **{field: "Hi {{{NAME}}} {{{OTHER}}}"}),
            400,
            "BAD_REQUEST",
        )
        assert f"{field}: " in message and "{{{OTHER}}}" in message and "NAME" not in message
    # Anything in triple braces is a placeholder, so a typo cannot slip through.
    message = assert_error(await create(client, html="{{{first name}}}"), 400, "BAD_REQUEST")
    assert "{{{first name}}}" in message
    # Double braces are plain text.
    assert (await create(client, html="<p>{{NAME}}</p>")).status_code == 201


async def test_unknown_fields_are_refused(client: httpx.AsyncClient) -> None:
    message = assert_error(await create(client, status="published"), 400, "BAD_REQUEST")
    assert "status: is not a known field" in message


# --- alias: unique per team, usable in paths -------------------------------------------------


async def test_duplicate_alias_is_409_within_a_team_only(
    client: httpx.AsyncClient, http: httpx.AsyncClient, make_token: MakeToken
) -> None:
    await created_id(client, alias="welcome")
    message = assert_error(await create(client, alias="welcome"), 409, "CONFLICT")
    assert "alias" in message and "welcome" in message
    # Aliases are compared exactly: another case is another alias.
    assert (await create(client, alias="Welcome")).status_code == 201
    other = await make_token(team="globex")
    response = await http.post(
        "/templates", json={**MINIMAL, "alias": "welcome"}, headers=other.headers
    )
    assert response.status_code == 201, response.text


async def test_get_by_alias_and_by_id_alike(client: httpx.AsyncClient) -> None:
    template_id = await created_id(client, alias="order-shipped")
    by_id = await client.get(f"/templates/{template_id}")
    by_alias = await client.get("/templates/order-shipped")
    assert by_id.status_code == by_alias.status_code == 200
    assert by_id.json() == by_alias.json()
    assert_error(await client.get("/templates/no-such-alias"), 404, "NOT_FOUND")
    assert_error(await client.get(f"/templates/{uuid.uuid4()}"), 404, "NOT_FOUND")
    message = assert_error(await client.get("/templates/not%20an%20alias"), 400, "BAD_REQUEST")
    assert "template" in message
    assert_error(await client.get("/templates/" + "a" * 101), 400, "BAD_REQUEST")


# --- list and delete ----------------------------------------------------------------------------


async def test_list_is_paged_newest_first_and_filters(client: httpx.AsyncClient) -> None:
    ids = [
        await created_id(client, name="Login code", alias="otp-login", category="otp"),
        await created_id(client, name="Welcome aboard", category="welcome"),
        await created_id(client, name="Password 100% reset", alias="reset", category="otp"),
    ]
    listed = (await client.get("/templates")).json()["data"]
    assert listed["object"] == "list" and listed["has_more"] is False
    assert [t["id"] for t in listed["data"]] == ids[::-1]
    assert "current_version" not in listed["data"][0]
    assert listed["data"][0]["current_version_number"] == 1

    first = (await client.get("/templates", params={"limit": 2})).json()["data"]
    assert [t["id"] for t in first["data"]] == ids[:0:-1] and first["has_more"] is True
    rest = (await client.get("/templates", params={"limit": 2, "offset": 2})).json()["data"]
    assert [t["id"] for t in rest["data"]] == ids[:1] and rest["has_more"] is False

    otp = (await client.get("/templates", params={"category": "otp"})).json()["data"]
    assert [t["id"] for t in otp["data"]] == [ids[2], ids[0]]
    by_name = (await client.get("/templates", params={"search": "WELCOME"})).json()["data"]
    assert [t["id"] for t in by_name["data"]] == [ids[1]]
    by_alias = (await client.get("/templates", params={"search": "login"})).json()["data"]
    assert [t["id"] for t in by_alias["data"]] == [ids[0]]
    # Wildcards in the search are taken literally.
    percent = (await client.get("/templates", params={"search": "100%"})).json()["data"]
    assert [t["id"] for t in percent["data"]] == [ids[2]]
    assert (await client.get("/templates", params={"search": "%"})).json()["data"]["data"] == [
        t for t in (await client.get("/templates")).json()["data"]["data"] if t["id"] == ids[2]
    ]
    assert_error(
        await client.get("/templates", params={"category": "nope"}), 400, "BAD_REQUEST"
    )
    message = assert_error(
        await client.get("/templates", params={"search": "a\x00b"}), 400, "BAD_REQUEST"
    )
    assert "search" in message


async def test_delete_by_id_or_alias_answers_204_and_frees_the_alias(
    client: httpx.AsyncClient,
) -> None:
    template_id = await created_id(client, alias="gone")
    version_id = (await client.get(f"/templates/{template_id}")).json()["data"][
        "current_version_id"
    ]
    deleted = await client.delete("/templates/gone")
    assert deleted.status_code == 204 and deleted.content == b""
    assert_error(await client.get(f"/templates/{template_id}"), 404, "NOT_FOUND")
    assert_error(
        await client.get(f"/templates/{template_id}/versions/{version_id}"), 404, "NOT_FOUND"
    )
    assert_error(await client.delete(f"/templates/{template_id}"), 404, "NOT_FOUND")
    assert (await create(client, alias="gone")).status_code == 201
    other = await created_id(client)
    assert (await client.delete(f"/templates/{other}")).status_code == 204


# --- permissions and team isolation ----------------------------------------------------------


async def test_read_and_write_permissions(http: httpx.AsyncClient, make_token: MakeToken) -> None:
    reader = await make_token(permissions=["templates:read"])
    writer = await make_token(permissions=["templates:write"])
    assert_error(
        await http.post("/templates", json=MINIMAL, headers=reader.headers), 403, "FORBIDDEN"
    )
    created = await http.post("/templates", json=MINIMAL, headers=writer.headers)
    assert created.status_code == 201
    template_id = created.json()["data"]["id"]
    assert_error(
        await http.get(f"/templates/{template_id}", headers=writer.headers), 403, "FORBIDDEN"
    )
    assert (await http.get(f"/templates/{template_id}", headers=reader.headers)).status_code == 200
    # Rendering is a read: it changes nothing.
    rendered = await http.post(f"/templates/{template_id}/render", headers=reader.headers)
    assert rendered.status_code == 200, rendered.text
    assert_error(
        await http.delete(f"/templates/{template_id}", headers=reader.headers), 403, "FORBIDDEN"
    )


async def test_another_teams_template_versions_and_alias_are_404(
    client: httpx.AsyncClient, http: httpx.AsyncClient, make_token: MakeToken
) -> None:
    template_id = await created_id(
        client, alias="secret", variables=[{"key": "A", "type": "string", "fallback_value": "a"}]
    )
    version_id = (await client.get(f"/templates/{template_id}")).json()["data"][
        "current_version_id"
    ]
    other = await make_token(team="globex")
    h = other.headers
    for ref in (template_id, "secret"):
        assert_error(await http.get(f"/templates/{ref}", headers=h), 404, "NOT_FOUND")
        assert_error(await http.get(f"/templates/{ref}/versions", headers=h), 404, "NOT_FOUND")
        assert_error(
            await http.get(f"/templates/{ref}/versions/{version_id}", headers=h),
            404,
            "NOT_FOUND",
        )
        assert_error(
            await http.patch(f"/templates/{ref}", json={"name": "x"}, headers=h),
            404,
            "NOT_FOUND",
        )
        assert_error(await http.post(f"/templates/{ref}/publish", headers=h), 404, "NOT_FOUND")
        assert_error(await http.post(f"/templates/{ref}/render", headers=h), 404, "NOT_FOUND")
        assert_error(await http.delete(f"/templates/{ref}", headers=h), 404, "NOT_FOUND")
    assert (await http.get("/templates", headers=h)).json()["data"]["data"] == []

    # A version of another team's template, named under one's own template.
    own = await http.post("/templates", json=MINIMAL, headers=h)
    own_id = own.json()["data"]["id"]
    assert_error(
        await http.get(f"/templates/{own_id}/versions/{version_id}", headers=h), 404, "NOT_FOUND"
    )
    assert_error(
        await http.post(
            f"/templates/{own_id}/publish", json={"version_id": version_id}, headers=h
        ),
        404,
        "NOT_FOUND",
    )
    assert_error(
        await http.post(
            f"/templates/{own_id}/render", json={"version_id": version_id}, headers=h
        ),
        404,
        "NOT_FOUND",
    )
    # And nothing of acme's changed.
    template = (await client.get(f"/templates/{template_id}")).json()["data"]
    assert template["name"] == "Welcome" and template["published_version_id"] is None


async def test_bad_version_uuid_in_the_path_is_400(client: httpx.AsyncClient) -> None:
    template_id = await created_id(client)
    message = assert_error(
        await client.get(f"/templates/{template_id}/versions/nope"), 400, "BAD_REQUEST"
    )
    assert "version_id" in message
