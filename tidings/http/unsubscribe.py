"""One-click unsubscribe (RFC 8058, CONTRACT §10): the links in broadcast emails.

No bearer token: the signed token in the path is the credential
(``tidings.unsubscribe``). ``GET`` shows a small page whose button POSTs
back (a plain form, no JavaScript), so that a mail scanner that follows
links unsubscribes nobody. ``POST`` unsubscribes: mail clients send it on
their own with ``List-Unsubscribe=One-Click`` in the body, which is not
needed and not read. A browser's form post (it accepts ``text/html``) gets a
page; any other client the JSON envelope. A token that is not one Tidings
signed is 404 with the error envelope, for both methods.
"""

from __future__ import annotations

import html

from quart import Response, request

from tidings.http.envelope import ApiError, json_response, success_body
from tidings.http.models import RawContent
from tidings.http.routing import Routes
from tidings.service import Service
from tidings.storage import broadcasts_unsubscribe as store
from tidings.unsubscribe import Unsubscribe

routes = Routes("Unsubscribe")

TOKEN: dict[str, type] = {"token": str}

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="robots" content="noindex">
<title>{title}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:32rem;margin:4rem auto;padding:0 1rem;
color:#222}}button{{font-size:1rem;padding:.6rem 1.2rem;cursor:pointer}}</style>
</head><body><h1>{title}</h1>{body}</body></html>
"""


def _page(title: str, body: str) -> Response:
    text = PAGE.format(title=html.escape(title), body=body)
    return Response(
        text, status=200, content_type="text/html; charset=utf-8",
        headers={"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"},
    )


async def _verified(service: Service, token: str) -> Unsubscribe:
    found = (await service.broadcasts.token_key()).verify(token)
    if found is None:
        raise ApiError(404, "NOT_FOUND", "unsubscribe link not found")
    return found


async def _what(service: Service, found: Unsubscribe) -> str:
    """What the link unsubscribes from, in words."""
    if found.topic_id is None:
        return "all broadcast emails"
    name = await service.db.run(store.topic_name, found.team_id, found.topic_id)
    return f"emails about “{name}”" if name else "emails about this topic"


@routes.route(
    "GET", "/unsubscribe/{token}", summary="The unsubscribe page of a broadcast email's link",
    public=True, path_types=TOKEN, response=RawContent("text/html", {"type": "string"}),
)
async def unsubscribe_page(service: Service, token: str) -> Response:
    found = await _verified(service, token)
    what = html.escape(await _what(service, found))
    return _page(
        "Unsubscribe",
        f"<p>Stop receiving {what}?</p>"
        '<form method="post"><button type="submit">Unsubscribe</button></form>',
    )


def _wants_html() -> bool:
    """Whether the client names ``text/html`` in its Accept header (a browser's
    form post does), with a quality above 0 and not below JSON's. ``*/*``
    alone (curl, mail clients' one-click POST) gets JSON."""
    accept = request.accept_mimetypes
    named = any(value.lower() == "text/html" and quality > 0 for value, quality in accept)
    return named and accept.quality("text/html") >= accept.quality("application/json")


@routes.route(
    "POST", "/unsubscribe/{token}", summary="Unsubscribe (one-click, RFC 8058)",
    public=True, path_types=TOKEN,
    response=RawContent(
        "application/json", {"type": "object"}, also=(("text/html", {"type": "string"}),)
    ),
)
async def unsubscribe(service: Service, token: str) -> Response:
    found = await _verified(service, token)
    await service.db.run(store.unsubscribe, found.team_id, found.contact_id, found.topic_id)
    if _wants_html():
        what = html.escape(await _what(service, found))
        return _page("Unsubscribed", f"<p>You will no longer receive {what}.</p>")
    return json_response(200, success_body({
        "object": "unsubscribe",
        "contact_id": str(found.contact_id),
        "topic_id": None if found.topic_id is None else str(found.topic_id),
        "unsubscribed": True,
    }))
