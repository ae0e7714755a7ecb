"""``POST /providers/smtp/reports``: delivery status notifications and abuse
reports, as raw messages, from the MTA that receives mail for the return
path (``docs/email.md``).

No bearer token: the caller proves itself with ``TIDINGS_REPORTS_SECRET``
(``Authorization: Bearer <secret>``); without the setting the route is off.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING, Any

import trio
from pydantic import BaseModel
from quart import request

from tidings.email.inbound import record_report
from tidings.email.reports import NotAReport, parse_reports
from tidings.http.envelope import ApiError, unprocessable
from tidings.http.openapi import REPORTS_SECRET
from tidings.http.parsing import read_body
from tidings.http.routing import Routes

if TYPE_CHECKING:
    from tidings.config import Config
    from tidings.service import Service

routes = Routes("Providers")


def _authorized(secret: str | None) -> bool:
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    return (
        secret is not None
        and scheme.lower() == "bearer"
        and hmac.compare_digest(given.strip().encode(), secret.encode())
    )


class HandledReport(BaseModel):
    recipient: str
    outcome: str
    original_message_id: str | None
    code: str | None
    message: str | None
    recorded: bool


class ReportAnswer(BaseModel):
    """What a report said, recipient by recipient, and how many outcomes it recorded."""

    recorded: int
    reports: list[HandledReport]


def report_limit(config: Config) -> int:
    """A DSN may return the whole message (RET=FULL), and an email accepted
    at TIDINGS_MAX_BODY_BYTES of JSON is a few times that on the wire
    (quoted-printable, base64): a report may be as large as a contact
    import (TIDINGS_IMPORT_MAX_BODY_BYTES), and never smaller than any
    request."""
    return max(config.import_max_body_bytes, config.max_body_bytes)


# The whole message as the MTA received it.
RAW_MESSAGE = {media: {"schema": {"type": "string"}} for media in ("message/rfc822", "*/*")}


@routes.route(
    "POST", "/providers/smtp/reports",
    summary="A delivery status notification (RFC 3464) or an abuse report (RFC 5965), raw",
    public=True, credential=REPORTS_SECRET, raw_body=RAW_MESSAGE, response=ReportAnswer,
    body_limit=report_limit,
)
async def receive_report(service: Service) -> dict[str, Any]:
    if not _authorized(service.config.reports_secret):
        raise ApiError(403, "FORBIDDEN", "a valid TIDINGS_REPORTS_SECRET bearer is required")
    raw = await read_body(report_limit(service.config))
    key = await service.emails.bounce_key()
    try:
        # Parsing a large report takes seconds of CPU: not on the event loop,
        # and not while holding a connection.
        parsed = await trio.to_thread.run_sync(parse_reports, raw)
    except NotAReport as error:
        raise unprocessable(f"body: {error}") from None
    async with service.db.transaction() as conn:
        handled = await record_report(conn, parsed, key)
    return {
        "recorded": sum(h.recorded for h in handled),
        "reports": [
            {
                "recipient": h.report.recipient,
                "outcome": h.report.outcome,
                "original_message_id": h.report.original_message_id,
                "code": h.report.code,
                "message": h.report.message,
                "recorded": h.recorded,
            }
            for h in handled
        ],
    }
