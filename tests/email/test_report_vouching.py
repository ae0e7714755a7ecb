"""A report is vouched for per recipient: it counts for a recipient only
when it came back to that recipient's own bounce address, so one recipient
of an email cannot report a bounce or a complaint for another."""

from __future__ import annotations

from uuid import UUID

import httpx
import pytest

from tests.email.helpers import events, ok
from tests.email.test_inbound_reports import (
    REPORTS,
    SAMPLE_RETURN_PATH,
    delivered_email,
    post_report,
    reports_config,
    suppressions,
)
from tidings.config import Config
from tidings.service import Service


@pytest.fixture
def config(database_url: str) -> Config:
    return reports_config(database_url)


async def two_recipients(
    client: httpx.AsyncClient, service: Service
) -> tuple[str, str, dict[str, bytes]]:
    """An email delivered to ada@ and bo@: its id, Message-ID and each one's bounce address."""
    email_id, message_id = await delivered_email(
        client, service, "ada@example.org", "bo@example.org"
    )
    key = await service.emails.bounce_key()
    back = {r: key.address(UUID(email_id), r, "bounces.acme.example").encode()
            for r in ("ada@example.org", "bo@example.org")}
    return email_id, message_id, back


def dsn_about_bo(message_id: str, came_back_to: bytes) -> bytes:
    """A DSN saying bo@ bounced, come back to ``came_back_to`` (To, Delivered-To
    and the original's Return-Path)."""
    raw = (REPORTS / "postfix_bounce.eml").read_bytes().replace(
        b"<MESSAGE_ID>", message_id.encode()
    ).replace(b"rfc822; gone@example.org", b"rfc822; bo@example.org")
    raw = raw.replace(b"Auto-Submitted:", b"Delivered-To: " + came_back_to + b"\nAuto-Submitted:")
    return raw.replace(SAMPLE_RETURN_PATH, came_back_to)


async def test_a_recipient_cannot_report_a_bounce_for_another(
    client: httpx.AsyncClient, http: httpx.AsyncClient, service: Service, acme_domain: str
) -> None:
    """ada@ got the email, knows its Message-ID and her own return path, and
    mails a DSN saying bo@ bounced: it did not come back to bo@'s bounce
    address, so it says nothing about bo@."""
    email_id, message_id, back = await two_recipients(client, service)
    forged = dsn_about_bo(message_id, back["ada@example.org"])
    answer = ok(await post_report(http, forged))
    assert [(r["recipient"], r["outcome"], r["recorded"]) for r in answer["reports"]] == [
        ("bo@example.org", "bounced", False), ("slow@example.org", "delivery_delayed", False)
    ]
    assert answer["recorded"] == 0
    assert await suppressions(client) == {}
    assert ok(await client.get(f"/emails/{email_id}"))["status"] == "delivered"
    assert "bounced" not in [e["type"] for e in await events(client, email_id)]
    # The same report come back to bo@'s own bounce address is bo@'s bounce.
    answer = ok(await post_report(http, dsn_about_bo(message_id, back["bo@example.org"])))
    assert [(r["recipient"], r["recorded"]) for r in answer["reports"]] == [
        ("bo@example.org", True), ("slow@example.org", False)
    ]
    assert await suppressions(client) == {"bo@example.org": "bounce"}
    assert ok(await client.get(f"/emails/{email_id}"))["status"] == "bounced"


async def test_a_tag_altered_or_left_out_vouches_for_nobody(
    client: httpx.AsyncClient, http: httpx.AsyncClient, service: Service, acme_domain: str
) -> None:
    email_id, message_id, back = await two_recipients(client, service)
    local, _, host = back["bo@example.org"].partition(b"@")
    for i in (27, 30, 33):  # in the tag; the last character included
        altered = local[:i] + (b"b" if local[i:i + 1] != b"b" else b"c") + local[i + 1:]
        raw = dsn_about_bo(message_id, altered + b"@" + host)
        assert ok(await post_report(http, raw))["recorded"] == 0, i
    # The untagged return path of old is not read either.
    old = dsn_about_bo(message_id, f"{email_id}@bounces.acme.example".encode())
    assert ok(await post_report(http, old))["recorded"] == 0
    assert await suppressions(client) == {}
    assert ok(await client.get(f"/emails/{email_id}"))["status"] == "delivered"
    # In another case, as an MTA may write it, it is still bo@'s.
    shouted = dsn_about_bo(message_id, back["bo@example.org"].upper())
    assert ok(await post_report(http, shouted))["recorded"] == 1
    assert await suppressions(client) == {"bo@example.org": "bounce"}


def arf_about_bo(message_id: str, return_path: bytes) -> bytes:
    """A mailbox provider's complaint about bo@, sent to a feedback address,
    with the message attached as delivered (its Return-Path ``return_path``)."""
    raw = (REPORTS / "abuse_report.eml").read_bytes().replace(
        b"<MESSAGE_ID>", message_id.encode()
    ).replace(b"Ada@Example.ORG", b"bo@example.org")
    raw = raw.replace(b"To: <" + SAMPLE_RETURN_PATH + b">", b"To: <fbl@acme.example>")
    raw = raw.replace(b"Original-Mail-From: <" + SAMPLE_RETURN_PATH + b">",
                      b"Original-Mail-From: <" + return_path + b">")
    return raw.replace(b"Content-Disposition: inline\n\n",
                       b"Content-Disposition: inline\n\nReturn-Path: <" + return_path + b">\n")


async def test_a_recipient_cannot_complain_for_another(
    client: httpx.AsyncClient, http: httpx.AsyncClient, service: Service, acme_domain: str
) -> None:
    email_id, message_id, back = await two_recipients(client, service)
    answer = ok(await post_report(http, arf_about_bo(message_id, back["ada@example.org"])))
    assert [(r["recipient"], r["outcome"], r["recorded"]) for r in answer["reports"]] == [
        ("bo@example.org", "complained", False)
    ]
    assert await suppressions(client) == {}
    assert ok(await client.get(f"/emails/{email_id}"))["status"] == "delivered"
    answer = ok(await post_report(http, arf_about_bo(message_id, back["bo@example.org"])))
    assert answer["recorded"] == 1
    assert await suppressions(client) == {"bo@example.org": "complaint"}
    assert ok(await client.get(f"/emails/{email_id}"))["status"] == "complained"


async def test_a_bounce_of_forwarded_mail_counts_for_the_recipient_the_sender_gave(
    client: httpx.AsyncClient, http: httpx.AsyncClient, service: Service, acme_domain: str
) -> None:
    """bo@ forwards his mail; the forwarding address bounces. The DSN names
    that address as its Final-Recipient and bo@ as its Original-Recipient,
    and came back to bo@'s bounce address: it is bo@'s bounce. Naming ada@
    as the original recipient does not make it hers."""
    email_id, message_id, back = await two_recipients(client, service)
    forwarded = dsn_about_bo(message_id, back["bo@example.org"]).replace(
        b"Final-Recipient: rfc822; bo@example.org",
        b"Original-Recipient: rfc822; ada@example.org\n"
        b"Final-Recipient: rfc822; bo.forwarded@elsewhere.example",
    )
    answer = ok(await post_report(http, forwarded))
    assert answer["recorded"] == 0  # ada@'s bounce address it did not come back to
    forwarded = forwarded.replace(b"Original-Recipient: rfc822; ada@example.org",
                                  b"Original-Recipient: rfc822; bo@example.org")
    answer = ok(await post_report(http, forwarded))
    assert [(r["recipient"], r["recorded"]) for r in answer["reports"]] == [
        ("bo.forwarded@elsewhere.example", True), ("slow@example.org", False)
    ]
    assert await suppressions(client) == {"bo@example.org": "bounce"}
    assert ok(await client.get(f"/emails/{email_id}"))["status"] == "bounced"
