"""The broadcast renderer's details: the subject and the numbers as templates
write them, and where the preheader goes in the html."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

import httpx

from tests.broadcasts.conftest import Audience, add_contact, draft
from tests.broadcasts.helpers import emails_of, wait_status
from tests.email.helpers import ok
from tidings.rendering import Variable, render
from tidings.service import Service
from tidings.storage.broadcasts_render import Plan, Rendered, Renderer, preheader_offset
from tidings.unsubscribe import TokenKey

PREHEADER = '<div style="display:none;max-height:0;overflow:hidden;mso-hide:all">'


@dataclass(frozen=True)
class Version:
    subject: str
    html: str = "h"
    text: str | None = None
    variables: tuple[Variable, ...] = ()


def _render(
    subject: str = "S",
    html: str = "<p>x</p>",
    text: str | None = None,
    *,
    preview_text: str | None = None,
    bindings: Mapping[str, Any] | None = None,
    fallbacks: Mapping[str, Any] | None = None,
    rows: Sequence[Sequence[Any]] | None = None,
) -> Rendered:
    plan = Plan.of(subject, html, text, preview_text, bindings or {}, fallbacks or {})
    renderer = Renderer(plan, TokenKey(b"k" * 32), "https://t.example/u/", uuid4(), None)
    if rows is None:
        rows = [(uuid4(), "ada@example.com", "Ada", None, None)]
    return renderer.render(rows)


def _properties(renderer_keys: list[str], values: Mapping[str, Any]) -> list[str | None]:
    """A contact's properties as the batch statement reads them: JSON text."""
    return [json.dumps(values[key]) if key in values else None for key in renderer_keys]


# --- the subject -------------------------------------------------------------------------


def test_the_subject_is_the_one_a_template_renders_for_the_same_input() -> None:
    subject = "Hi \x1b{{{A}}}\u2028!\x7f"
    value = "a\u2028b\u000bc\u0085d\x1be\r\nf"
    template = render(Version(subject, variables=(Variable("A", "string"),)), {"A": value})
    assert template.subject == "Hi a b c de f !"
    # The value as a binding (a default), and as the contact's own value.
    assert _render(subject, bindings={"A": value}).subjects == [template.subject]
    html = "<p>{{{A}}}</p>"
    plan = Plan.of(subject, html, None, None, {}, {})
    renderer = Renderer(plan, TokenKey(b"k" * 32), "https://t.example/u/", uuid4(), None)
    row = (uuid4(), "ada@example.com", None, None, _properties(renderer.property_keys,
                                                               {"A": value}))
    made = renderer.render([row])
    assert made.subjects == [template.subject]
    # The html and the text keep the value (escaped in the html).
    assert made.htmls == ["<p>a\u2028b\u000bc\u0085d\x1be\r\nf</p>"]


# --- numbers -----------------------------------------------------------------------------


def test_numbers_are_written_as_templates_write_them_whatever_gives_them() -> None:
    subject = "{{{seats}}} {{{tiny}}} {{{big}}} {{{b1}}} {{{vip}}} {{{name}}}"
    plan = Plan.of(subject, "h", None, None, {"b1": 5.0}, {"tiny": 1e-7})
    renderer = Renderer(plan, TokenKey(b"k" * 32), "https://t.example/u/", uuid4(), None)
    own = {"seats": 5.0, "big": 1e16, "vip": True, "name": "5.0"}
    row = (uuid4(), "ada@example.com", None, None, _properties(renderer.property_keys, own))
    assert renderer.render([row]).subjects == ["5 1e-7 10000000000000000 5 true 5.0"]
    # A property stored by PostgreSQL comes back in its own spelling: 1e16 as
    # digits, 1e-7 as 0.0000001. Still written as templates write them.
    postgres = {"seats": "5.0", "big": "10000000000000000", "tiny": "0.0000001",
                "vip": "true", "name": '"5.0"'}
    row = (uuid4(), "ada@example.com", None, None,
           [postgres.get(key) for key in renderer.property_keys])
    assert renderer.render([row]).subjects == ["5 1e-7 10000000000000000 5 true 5.0"]


async def test_a_contact_property_of_5_0_is_written_5_like_a_binding(
    client: httpx.AsyncClient, audience: Audience, service: Service
) -> None:
    for key in ("seats", "big", "tiny"):
        ok(await client.post("/contact-properties", json={"key": key, "type": "number"}), 201)
    await add_contact(client, audience.segment_id, email="gus@example.com", first_name="Gus",
                      properties={"seats": 5.0, "big": 1e16, "tiny": 1e-7})
    body = draft(audience, subject="{{{seats}}} seats, b1 {{{b1}}}",
                 html="<p>{{{seats}}} {{{b1}}} {{{big}}} {{{tiny}}}</p>",
                 variable_bindings={"b1": 5.0, "first_name": "friend", "promo": "x",
                                    "seats": 1, "big": 1, "tiny": 1})
    bid = ok(await client.post("/broadcasts", json=body), 201)["id"]
    ok(await client.post(f"/broadcasts/{bid}/send"))
    await wait_status(service, bid, "sent")
    gus = {e["to_addresses"][0]: e for e in await emails_of(service, bid)}["gus@example.com"]
    assert gus["subject"] == "5 seats, b1 5"
    assert gus["html"] == "<p>5 5 10000000000000000 1e-7</p>"


# --- the preheader -----------------------------------------------------------------------


def test_the_preheader_follows_the_body_tag() -> None:
    html = (
        '<!DOCTYPE html><html lang="en"><head><title>{{{first_name}}}</title></head>'
        '<BODY class="{{{first_name}}}" style="margin:0"><p>Hi {{{first_name}}}</p></BODY></html>'
    )
    made = _render(html=html, preview_text="Spring <sale>")
    assert made.htmls == [
        '<!DOCTYPE html><html lang="en"><head><title>Ada</title></head>'
        f'<BODY class="Ada" style="margin:0">{PREHEADER}Spring &lt;sale&gt;</div>'
        "<p>Hi Ada</p></BODY></html>"
    ]


def test_where_the_preheader_goes_without_a_body_tag() -> None:
    # Each html, and what comes before the preheader.
    cases = [
        # After </head>: the body starts there.
        ("<!doctype html><html><head><style>p{}</style></head><p>x</p>",
         "<!doctype html><html><head><style>p{}</style></head>"),
        ("<head></head ><body\n>x", "<head></head ><body\n>"),
        # After a leading doctype and <html ...> tag.
        ("<!DOCTYPE html>\n<html lang=en>\n<p>x</p>", "<!DOCTYPE html>\n<html lang=en>"),
        ("<!DOCTYPE html><p>x</p>", "<!DOCTYPE html>"),
        # A fragment: at the top.
        ("<p>x</p>", ""),
        ("  <p>x</p>", ""),
        ("<p>{{{ first_name }}}</p><bodyguard>", ""),
        # A body tag in a comment (an Outlook conditional) does not count.
        ("<!--[if mso]><body class=o><![endif]--><body><p>x</p>",
         "<!--[if mso]><body class=o><![endif]--><body>"),
        ("<!-- <body> --><p>x</p>", ""),
        # A "<!--" in a script or an attribute value starts no comment.
        ('<html><head><script>var m="<!--";</script></head><body class="b"><p>x</p>',
         '<html><head><script>var m="<!--";</script></head><body class="b">'),
        ("<head><style>/* <!-- */</style></head><p>x</p>",
         "<head><style>/* <!-- */</style></head>"),
        ('<body data-x="<!--"><p>x</p>', '<body data-x="<!--">'),
    ]
    for html, before in cases:
        assert html[:preheader_offset(html)] == before, html
    made = _render(html="<!DOCTYPE html><p>x</p>", preview_text="P")
    assert made.htmls == [f"<!DOCTYPE html>{PREHEADER}P</div><p>x</p>"]
    made = _render(html="<p>x</p>", preview_text="P")
    assert made.htmls == [f"{PREHEADER}P</div><p>x</p>"]


def test_preview_text_is_literal_text() -> None:
    made = _render(html="<body>{{{first_name}}}</body>", preview_text="Hi {{{first_name}}} & co")
    assert made.htmls == [f"<body>{PREHEADER}Hi {{{{{{first_name}}}}}} &amp; co</div>Ada</body>"]


async def test_a_sent_broadcast_keeps_its_doctype_first(
    client: httpx.AsyncClient, audience: Audience, service: Service
) -> None:
    html = ('<!DOCTYPE html><html><head><meta charset="utf-8"></head>'
            '<body style="margin:0"><p>Hi {{{first_name}}}</p></body></html>')
    body = draft(audience, html=html, preview_text="Spring sale")
    bid = ok(await client.post("/broadcasts", json=body), 201)["id"]
    ok(await client.post(f"/broadcasts/{bid}/send"))
    await wait_status(service, bid, "sent")
    ada = {e["to_addresses"][0]: e for e in await emails_of(service, bid)}["ada@example.com"]
    assert ada["html"] == (
        '<!DOCTYPE html><html><head><meta charset="utf-8"></head>'
        f'<body style="margin:0">{PREHEADER}Spring sale</div><p>Hi Ada</p></body></html>'
    )


def test_the_preheader_never_goes_inside_a_placeholder_whatever_its_key() -> None:
    """A binding's key may hold anything, a comment's end or a body tag too."""
    shown = f"{PREHEADER}pre</div>"
    for key in ("-->x<body>y", "<body>", "--><body>", "a<!--b"):
        cases = [
            ("<!--{{{K}}}", f"{shown}<!--V"),
            ("<p>{{{K}}}</p><body>x", f"<p>V</p><body>{shown}x"),
            ("<!-- {{{K}}} --><body>x", f"<!-- V --><body>{shown}x"),
        ]
        for html, expected in cases:
            made = _render(html=html.replace("K", key), preview_text="pre", bindings={key: "V"})
            assert made.htmls == [expected], (key, html)


def test_a_body_tag_inside_a_title_a_script_or_an_attribute_is_not_the_body() -> None:
    cases = [
        ('<html><head><title>Sale <body> deals</title></head><body><p>Hi</p>',
         '<html><head><title>Sale <body> deals</title></head><body>'),
        ('<head><script>var s="<body>";</script></head><body>X',
         '<head><script>var s="<body>";</script></head><body>'),
        ('<head><meta content="<body>"></head><body>X',
         '<head><meta content="<body>"></head><body>'),
        ('<body data-x="a>b">X', '<body data-x="a>b">'),
        ('<html>\r\n<head><title>a\r\n<body></title>\n</head>\r\n<body\n class=x>\nX',
         '<html>\r\n<head><title>a\r\n<body></title>\n</head>\r\n<body\n class=x>'),
    ]
    for html, before in cases:
        assert html[: preheader_offset(html)] == before, html


def test_an_email_past_a_templates_limits_fails_for_its_recipient() -> None:
    """As POST /emails refuses a template's render with 422: a subject too
    long or with nothing to see, an email over 4 MiB."""
    rows = [(uuid4(), f"r{n}@example.com", name, None, None)
            for n, name in enumerate(["Ada", "", " \t", "x" * 999, "Bo"])]
    made = _render(subject="{{{first_name}}}", rows=rows)
    assert (made.subjects, made.failed) == (["Ada", "Bo"], 3)
    big = _render(html="<p>" + "{{{big}}}" * 50 + "</p>", bindings={"big": "x" * 100_000})
    assert (big.htmls, big.failed) == ([], 1)
    fits = _render(html="<p>" + "{{{big}}}" * 20 + "</p>", bindings={"big": "x" * 100_000})
    assert (len(fits.htmls), fits.failed) == (1, 0)
