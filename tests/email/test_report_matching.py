"""A report is matched to its email however a relay wrote the original's
Message-ID, and to its recipient in any spelling RFC 5321 holds to be the
same mailbox."""

from __future__ import annotations

import httpx
import pytest

from tests.email.helpers import ok
from tests.email.test_inbound_reports import (
    delivered_email,
    post_report,
    report,
    reports_config,
    suppressions,
)
from tidings.config import Config
from tidings.service import Service


@pytest.fixture
def config(database_url: str) -> Config:
    return reports_config(database_url)


@pytest.mark.parametrize("written", [
    lambda mid: mid.upper(),  # a relay that changed its case
    lambda mid: f"{mid} (kept by relay.example)",  # a comment beside it
    lambda mid: "<relay-123@smtp.relay.example>",  # a relay's own id, as SES writes
])
async def test_a_message_id_written_otherwise_is_matched_by_the_bounce_address(
    client: httpx.AsyncClient, http: httpx.AsyncClient, service: Service, acme_domain: str,
    written: object,
) -> None:
    email_id, message_id = await delivered_email(client, service, "gone@example.org")
    raw = await report(service, "postfix_bounce.eml", message_id)
    assert callable(written)
    raw = raw.replace(f"Message-ID: {message_id}".encode(),
                      f"Message-ID: {written(message_id)}".encode())
    answer = ok(await post_report(http, raw))
    assert [(r["recipient"], r["recorded"]) for r in answer["reports"]] == [
        ("gone@example.org", True), ("slow@example.org", False),
    ]
    assert ok(await client.get(f"/emails/{email_id}"))["status"] == "bounced"
    assert await suppressions(client) == {"gone@example.org": "bounce"}


@pytest.mark.parametrize("named", ["gone@example.org.", '"gone"@example.org'])
async def test_a_recipient_named_in_another_spelling_of_its_mailbox(
    client: httpx.AsyncClient, http: httpx.AsyncClient, service: Service, acme_domain: str,
    named: str,
) -> None:
    email_id, message_id = await delivered_email(client, service, "gone@example.org")
    raw = (await report(service, "postfix_bounce.eml", message_id)).replace(
        b"Final-Recipient: rfc822; gone@example.org", f"Final-Recipient: rfc822; {named}".encode()
    )
    answer = ok(await post_report(http, raw))
    assert answer["recorded"] == 1, answer
    assert ok(await client.get(f"/emails/{email_id}"))["status"] == "bounced"
    assert await suppressions(client) == {"gone@example.org": "bounce"}
