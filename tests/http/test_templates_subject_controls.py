"""A template's subject is a mail header: it is refused with control
characters, as POST /emails refuses them, and a rendered one loses those its
values bring. Numbers are written in plain decimal."""

from __future__ import annotations

from typing import Any

import httpx

from tests.conftest import Credential, assert_error
from tests.email.conftest import verified_domain
from tests.email.helpers import ok
from tidings.service import Service

REFUSED = ["\u000b", "\u001b", "\u007f", "\u2028", "\u2029", "\u0085", "\u009f"]
BASE = {"name": "t", "html": "<p>h</p>", "from": "hi@acme.example"}


async def test_a_subject_with_a_control_character_is_400_on_create_and_patch(
    client: httpx.AsyncClient,
) -> None:
    created = ok(await client.post("/templates", json={**BASE, "subject": "a\tb"}), 201)
    for character in REFUSED:
        subject = f"a{character}b"
        message = assert_error(
            await client.post("/templates", json={**BASE, "subject": subject}), 400, "BAD_REQUEST"
        )
        assert message.endswith("subject: control characters are not allowed"), message
        emailed = await client.post("/emails", json={
            "from": "hi@acme.example", "to": "ann@example.com", "subject": subject, "html": "h",
        })
        assert assert_error(emailed, 400, "BAD_REQUEST") == message
        patched = await client.patch(f"/templates/{created['id']}", json={"subject": subject})
        assert assert_error(patched, 400, "BAD_REQUEST") == message
    listed = ok(await client.get(f"/templates/{created['id']}/versions"))
    assert [v["subject"] for v in listed["data"]] == ["a\tb"]  # no version was added


async def _template(client: httpx.AsyncClient, **fields: Any) -> str:
    body = {**BASE, "subject": "Hi {{{A}}}", "variables": [{"key": "A", "type": "string"}],
            **fields}
    return str(ok(await client.post("/templates", json=body), 201)["id"])


async def test_a_rendered_subject_loses_what_a_value_brings(client: httpx.AsyncClient) -> None:
    template_id = await _template(client, text="{{{A}}}")
    value = "a\u2028b\u000bc\u0085d\u001be\u007f\u2029f\r\ng"
    rendered = ok(await client.post(
        f"/templates/{template_id}/render", json={"variables": {"A": value}}
    ))
    # Line breaks and separators become a space; other control characters go.
    assert rendered["subject"] == "Hi a b c de f g"
    assert rendered["text"] == value


async def test_an_email_from_a_template_has_a_clean_subject_and_plain_numbers(
    client: httpx.AsyncClient, service: Service, base_url: str, acme: Credential
) -> None:
    await verified_domain(service, base_url, acme, "acme.example")
    template_id = await _template(
        client, subject="Hi {{{A}}}: {{{N}}}", html="<p>{{{N}}} {{{M}}}</p>",
        variables=[{"key": "A", "type": "string"}, {"key": "N", "type": "number"},
                   {"key": "M", "type": "number", "fallback_value": 1e-7}],
    )
    ok(await client.post(f"/templates/{template_id}/publish"))
    sent = ok(await client.post("/emails", json={
        "to": "ann@example.com",
        "template": {"id": template_id, "variables": {"A": "x\u2028y\u001bz", "N": 1e16}},
    }), 202)
    email = ok(await client.get(f"/emails/{sent['id']}"))
    assert email["subject"] == "Hi x yz: 10000000000000000"
    assert email["html"] == "<p>10000000000000000 1e-7</p>"
