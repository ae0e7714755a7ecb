"""Delivery reports that arrive later: a real DSN and a real ARF report,
posted raw, become ``bounced``/``complained`` events and suppressions."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import pytest
import trio

from tests.conftest import assert_error
from tests.email.helpers import SENDER, bounce_addresses, events, ok
from tidings.config import Config
from tidings.email.inbound import record_report
from tidings.email.reports import parse_reports
from tidings.service import Service

SECRET = "reports-secret-1"
REPORTS = Path(__file__).parent / "reports"


def reports_config(database_url: str) -> Config:
    """A service that takes reports (with ``SECRET``) and sends in the sandbox."""
    return Config(
        database_url=database_url, db_pool_size=6, rate_limit_per_second=0,
        shutdown_grace_seconds=2, email_poll_seconds=0.2, reports_secret=SECRET,
        # A report of megabytes (TIDINGS_MAX_BODY_BYTES raised) is parsed below.
        max_body_bytes=8 * 1024 * 1024,
    )


@pytest.fixture
def config(database_url: str) -> Config:
    return reports_config(database_url)


async def delivered_email(
    client: httpx.AsyncClient, service: Service, *to: str
) -> tuple[str, str]:
    """An email sent (sandbox) and delivered to ``to``; its id and Message-ID."""
    data = ok(await client.post(
        "/emails", json={"from": SENDER, "to": list(to), "subject": "Your receipt", "html": "x"}
    ), 202)
    with trio.fail_after(10):
        while ok(await client.get(f"/emails/{data['id']}"))["status"] != "delivered":
            await trio.sleep(0.05)
    async with service.db.acquire() as conn:
        message_id = await conn.fetchval(
            "SELECT smtp_message_id FROM emails WHERE id = $1", UUID(data["id"])
        )
    return data["id"], message_id


async def post_report(http: httpx.AsyncClient, raw: bytes, secret: str = SECRET) -> Any:
    return await http.post(
        "/providers/smtp/reports", content=raw,
        headers={"Authorization": f"Bearer {secret}", "Content-Type": "message/rfc822"},
    )


SAMPLE_RETURN_PATH = b"b-0f6c@bounces.acme.example"


async def report(service: Service, name: str, message_id: str) -> bytes:
    """The sample report about ``message_id``, come back to the bounce
    addresses of the email's recipients: its To names them all, the other
    places (the original's Return-Path) the first."""
    raw = (REPORTS / name).read_bytes().replace(b"<MESSAGE_ID>", message_id.encode())
    back = [a.encode() for a in await bounce_addresses(service, message_id)]
    if not back:
        return raw
    raw = re.sub(rb"^To: <?" + re.escape(SAMPLE_RETURN_PATH) + rb">?$",
                 b"To: " + b", ".join(back), raw, flags=re.MULTILINE)
    return raw.replace(SAMPLE_RETURN_PATH, back[0])


def _tomorrow() -> str:
    return (datetime.now(UTC) + timedelta(days=1)).isoformat()


async def suppressions(client: httpx.AsyncClient) -> dict[str, str]:
    listed = ok(await client.get("/suppressions"))["data"]
    return {s["address"]: s["reason"] for s in listed}


async def test_dsn_bounces_and_suppresses(
    client: httpx.AsyncClient, http: httpx.AsyncClient, service: Service, acme_domain: str
) -> None:
    email_id, message_id = await delivered_email(
        client, service, "gone@example.org", "slow@example.org"
    )
    answer = ok(await post_report(http, await report(service, "postfix_bounce.eml", message_id)))
    assert answer["recorded"] == 2
    assert [(r["recipient"], r["outcome"], r["code"]) for r in answer["reports"]] == [
        ("gone@example.org", "bounced", "5.1.1"), ("slow@example.org", "delivery_delayed", "4.4.1")
    ]
    found = await events(client, email_id)
    bounced = [e for e in found if e["type"] == "bounced"]
    assert len(bounced) == 1
    assert "User unknown" in str(bounced[0])
    assert any(e["type"] == "delivery_delayed" for e in found)
    assert await suppressions(client) == {"gone@example.org": "bounce"}
    # slow@ was delivered already: its delay is old news and the bounce stands.
    assert ok(await client.get(f"/emails/{email_id}"))["status"] == "bounced"


async def test_a_delay_reported_after_the_delivery_leaves_the_status(
    client: httpx.AsyncClient, http: httpx.AsyncClient, service: Service, acme_domain: str
) -> None:
    email_id, message_id = await delivered_email(client, service, "slow@example.org")
    answer = ok(await post_report(http, await report(service, "postfix_bounce.eml", message_id)))
    assert [(r["recipient"], r["outcome"], r["recorded"]) for r in answer["reports"]] == [
        ("gone@example.org", "bounced", False), ("slow@example.org", "delivery_delayed", True)
    ]
    assert [e["type"] for e in await events(client, email_id)][:2] == [
        "delivery_delayed", "delivered"
    ]
    assert ok(await client.get(f"/emails/{email_id}"))["status"] == "delivered"


async def test_a_dsn_without_the_original_is_matched_by_the_return_path_it_came_to(
    client: httpx.AsyncClient, http: httpx.AsyncClient, service: Service, acme_domain: str
) -> None:
    email_id, message_id = await delivered_email(client, service, "gone@example.org")
    raw = await report(service, "postfix_bounce.eml", message_id)
    head, _, rest = raw.partition(b"Content-Type: text/rfc822-headers")
    raw = head[: head.rindex(b"--")] + rest[rest.index(b"--"):]  # no original attached
    assert message_id.encode() not in raw
    answer = ok(await post_report(http, raw))
    assert answer["reports"][0]["original_message_id"] == f"<{email_id}@acme.example>"
    assert answer["recorded"] == 1  # gone@ was a recipient; slow@ was not
    assert ok(await client.get(f"/emails/{email_id}"))["status"] == "bounced"
    assert await suppressions(client) == {"gone@example.org": "bounce"}


async def test_a_not_spam_report_is_no_complaint(
    client: httpx.AsyncClient, http: httpx.AsyncClient, service: Service, acme_domain: str
) -> None:
    email_id, message_id = await delivered_email(client, service, "ada@example.org")
    raw = await report(service, "abuse_report.eml", message_id)
    answer = ok(await post_report(http, raw.replace(b"Feedback-Type: abuse",
                                                    b"Feedback-Type: not-spam")))
    assert answer["recorded"] == 0 and answer["reports"] == []
    assert ok(await client.get(f"/emails/{email_id}"))["status"] == "delivered"
    assert await suppressions(client) == {}
    # A complaint after it is still one.
    assert ok(await post_report(http, raw))["recorded"] == 1
    assert await suppressions(client) == {"ada@example.org": "complaint"}


async def test_arf_complaint_suppresses(
    client: httpx.AsyncClient, http: httpx.AsyncClient, service: Service, acme_domain: str
) -> None:
    email_id, message_id = await delivered_email(client, service, "ada@example.org")
    answer = ok(await post_report(http, await report(service, "abuse_report.eml", message_id)))
    assert answer["recorded"] == 1
    assert ok(await client.get(f"/emails/{email_id}"))["status"] == "complained"
    assert [e["type"] for e in await events(client, email_id)][0] == "complained"
    assert await suppressions(client) == {"ada@example.org": "complaint"}


async def test_unknown_message_and_refusals(
    client: httpx.AsyncClient, http: httpx.AsyncClient, service: Service
) -> None:
    unknown = await report(service, "abuse_report.eml", "<nobody@acme.example>")
    answer = ok(await post_report(http, unknown))
    assert answer["recorded"] == 0 and answer["reports"][0]["recorded"] is False
    assert await suppressions(client) == {}
    raw = await report(service, "abuse_report.eml", "<x@acme.example>")
    assert_error(await post_report(http, raw, "wrong"), 403, "FORBIDDEN")
    assert_error(await http.post("/providers/smtp/reports", content=raw), 403, "FORBIDDEN")
    message = assert_error(
        await post_report(http, b"From: a@b.example\n\nhello\n"), 422, "UNPROCESSABLE_ENTITY"
    )
    assert "multipart/report" in message


async def test_a_report_only_speaks_for_recipients_the_email_was_sent_to(
    client: httpx.AsyncClient, http: httpx.AsyncClient, service: Service, acme_domain: str
) -> None:
    """A report names the address it is about; one the email never went to
    (a forged report, or a typo) changes nothing and suppresses no one."""
    email_id, message_id = await delivered_email(client, service, "ada@example.org")
    forged = (await report(service, "postfix_bounce.eml", message_id)).replace(
        b"Final-Recipient: rfc822; gone@example.org",
        b"Final-Recipient: rfc822; victim@else.example",
    )
    answer = ok(await post_report(http, forged))
    assert answer["recorded"] == 0
    assert [r["recorded"] for r in answer["reports"]] == [False, False]
    assert ok(await client.get(f"/emails/{email_id}"))["status"] == "delivered"
    assert await suppressions(client) == {}
    # The address as sent, whatever its case in the report.
    shouted = (await report(service, "abuse_report.eml", message_id)).replace(
        b"ada@example.org", b"ADA@Example.ORG"
    )
    assert ok(await post_report(http, shouted))["recorded"] == 1
    assert await suppressions(client) == {"ada@example.org": "complaint"}


async def test_a_report_about_an_email_not_sent_records_nothing(
    client: httpx.AsyncClient, http: httpx.AsyncClient, service: Service, acme_domain: str
) -> None:
    later = ok(await client.post("/emails", json={
        "from": SENDER, "to": "gone@example.org", "subject": "Soon", "html": "x",
        "scheduled_at": _tomorrow(),
    }), 202)
    async with service.db.acquire() as conn:
        message_id = await conn.fetchval(
            "SELECT smtp_message_id FROM emails WHERE id = $1", UUID(later["id"])
        )
    answer = ok(await post_report(http, await report(service, "postfix_bounce.eml", message_id)))
    assert answer["recorded"] == 0
    assert ok(await client.get(f"/emails/{later['id']}"))["status"] == "scheduled"
    assert await suppressions(client) == {}
    assert ok(await client.post(f"/emails/{later['id']}/cancel"))["status"] == "canceled"
    arf = await report(service, "abuse_report.eml", message_id)
    assert ok(await post_report(http, arf))["recorded"] == 0
    assert ok(await client.get(f"/emails/{later['id']}"))["status"] == "canceled"


async def test_nul_and_8bit_fields_in_a_report_are_answered_not_500(
    client: httpx.AsyncClient, http: httpx.AsyncClient, service: Service, acme_domain: str
) -> None:
    email_id, message_id = await delivered_email(
        client, service, "gone@example.org", "slow@example.org"
    )
    raw = await report(service, "postfix_bounce.eml", message_id)
    mangled = raw.replace(b"Status: 5.1.1", b"Status: 5.1.1\x00").replace(
        b"Diagnostic-Code: smtp; 550", b"Diagnostic-Code: smtp; 550 bad\x00nul"
    ).replace(b"Final-Recipient: rfc822; slow@example.org",
              b"Final-Recipient: rfc822; sl\x00ow@example.org")
    answer = ok(await post_report(http, mangled))
    assert [(r["recipient"], r["recorded"]) for r in answer["reports"]] == [
        ("gone@example.org", True)
    ]
    assert answer["reports"][0]["code"] == "5.1.1"
    assert "\x00" not in answer["reports"][0]["message"]
    international = raw.replace(b"rfc822; gone@example.org", "rfc822; gön@example.org".encode())
    answer = ok(await post_report(http, international))
    assert answer["reports"][0]["recipient"] == "gön@example.org"
    assert answer["reports"][0]["recorded"] is False
    assert await suppressions(client) == {"gone@example.org": "bounce"}
    assert [e["type"] for e in await events(client, email_id)].count("bounced") == 1


async def test_a_report_names_an_internationalised_domain_in_either_form(
    client: httpx.AsyncClient, http: httpx.AsyncClient, service: Service, acme_domain: str
) -> None:
    """The email is stored with the Unicode domain and sent with the xn-- one;
    a report naming either, in any case, is about the address as sent."""
    email_id, message_id = await delivered_email(client, service, "gone@xn--mnchen-3ya.com")
    assert ok(await client.get(f"/emails/{email_id}"))["to"] == ["gone@münchen.com"]
    dsn = (await report(service, "postfix_bounce.eml", message_id)).replace(
        b"rfc822; gone@example.org", b"rfc822; gone@XN--MNCHEN-3YA.com"
    )
    answer = ok(await post_report(http, dsn))
    assert [(r["recipient"], r["recorded"]) for r in answer["reports"]] == [
        ("gone@XN--MNCHEN-3YA.com", True), ("slow@example.org", False)
    ]
    [bounced] = [e for e in await events(client, email_id) if e["type"] == "bounced"]
    assert bounced["recipient"] == "gone@münchen.com"
    assert await suppressions(client) == {"gone@münchen.com": "bounce"}
    # An abuse report naming the A-label form; a complaint after a bounce is news.
    arf = (await report(service, "abuse_report.eml", message_id)).replace(
        b"Ada@Example.ORG", b"gone@xn--mnchen-3ya.com"
    )
    assert ok(await post_report(http, arf))["recorded"] == 1
    assert ok(await client.get(f"/emails/{email_id}"))["status"] == "complained"
    # An address that does not parse is about nobody: answered, not a 500.
    for mangled in (b"gone@xn--", b"gone@xn--mnchen-3ya..com", b"@xn--mnchen-3ya.com", b"gone"):
        answer = ok(await post_report(http, dsn.replace(b"gone@XN--MNCHEN-3YA.com", mangled)))
        assert answer["recorded"] == 0


async def webhook_events(service: Service, email_id: str, type: str) -> int:
    async with service.db.acquire() as conn:
        count: int = await conn.fetchval(
            "SELECT count(*) FROM events WHERE message_id = $1 AND type = $2",
            UUID(email_id), f"message.{type}",
        )
    return count


async def test_a_report_sent_again_records_nothing_more(
    client: httpx.AsyncClient, http: httpx.AsyncClient, service: Service, acme_domain: str
) -> None:
    """An MTA that retries a report (at least once) says nothing new: one
    event and one webhook event per recipient and outcome, however often."""
    email_id, message_id = await delivered_email(
        client, service, "gone@example.org", "slow@example.org"
    )
    raw = await report(service, "postfix_bounce.eml", message_id)
    assert ok(await post_report(http, raw))["recorded"] == 2
    for _ in range(2):
        answer = ok(await post_report(http, raw))
        assert answer["recorded"] == 0
        assert [(r["recipient"], r["outcome"], r["recorded"]) for r in answer["reports"]] == [
            ("gone@example.org", "bounced", False), ("slow@example.org", "delivery_delayed", False)
        ]
    types = [e["type"] for e in await events(client, email_id)]
    assert types.count("bounced") == 1 and types.count("delivery_delayed") == 1
    assert await webhook_events(service, email_id, "bounced") == 1
    assert await webhook_events(service, email_id, "delivery_delayed") == 1
    # Another type for the same recipient is a new outcome, once.
    arf = (await report(service, "abuse_report.eml", message_id)).replace(
        b"Ada@Example.ORG", b"GONE@example.org"
    )
    assert ok(await post_report(http, arf))["recorded"] == 1
    assert ok(await post_report(http, arf))["recorded"] == 0
    assert await webhook_events(service, email_id, "complained") == 1
    assert ok(await client.get(f"/emails/{email_id}"))["status"] == "complained"


async def test_a_report_of_a_bounce_the_sandbox_recorded_is_no_new_bounce(
    client: httpx.AsyncClient, http: httpx.AsyncClient, service: Service, acme_domain: str
) -> None:
    """Whoever recorded the outcome first (the provider's own later outcome
    here), the relay's report of it is not a second one."""
    data = ok(await client.post("/emails", json={
        "from": SENDER, "to": "bounced@example.org", "subject": "Your receipt", "html": "x"
    }), 202)
    with trio.fail_after(10):
        while ok(await client.get(f"/emails/{data['id']}"))["status"] != "bounced":
            await trio.sleep(0.05)
    async with service.db.acquire() as conn:
        message_id = await conn.fetchval(
            "SELECT smtp_message_id FROM emails WHERE id = $1", UUID(data["id"])
        )
    dsn = (await report(service, "postfix_bounce.eml", message_id)).replace(b"gone@", b"bounced@")
    assert ok(await post_report(http, dsn))["reports"][0]["recorded"] is False
    assert await webhook_events(service, data["id"], "bounced") == 1


async def test_identical_reports_at_once_record_one_outcome(
    client: httpx.AsyncClient, http: httpx.AsyncClient, service: Service, acme_domain: str
) -> None:
    email_id, message_id = await delivered_email(
        client, service, "gone@example.org", "slow@example.org"
    )
    raw = await report(service, "postfix_bounce.eml", message_id)
    answers: list[int] = []

    async def post() -> None:
        answers.append(ok(await post_report(http, raw))["recorded"])

    async with trio.open_nursery() as nursery:
        for _ in range(6):
            nursery.start_soon(post)
    assert sorted(answers) == [0, 0, 0, 0, 0, 2]
    assert await webhook_events(service, email_id, "bounced") == 1
    assert await webhook_events(service, email_id, "delivery_delayed") == 1

    # The second of two transactions waits for the first to end, then sees
    # what it recorded: nothing is recorded twice even though neither had
    # committed when both began.
    arf = (await report(service, "abuse_report.eml", message_id)).replace(
        b"Ada@Example.ORG", b"slow@example.org"
    )
    second: list[list[bool]] = []
    key = await service.emails.bounce_key()

    async def record_second() -> None:
        async with service.db.transaction() as conn:
            second.append([h.recorded for h in await record_report(conn, parse_reports(arf), key)])

    async with trio.open_nursery() as nursery:
        async with service.db.transaction() as conn:
            handled = await record_report(conn, parse_reports(arf), key)
            assert [h.recorded for h in handled] == [True]
            nursery.start_soon(record_second)
            await trio.sleep(0.5)
            assert second == []  # waiting for the email's row
    assert second == [[False]]
    assert await webhook_events(service, email_id, "complained") == 1



async def test_a_failure_after_transient_errors_is_failed_not_a_bounce(
    client: httpx.AsyncClient, http: httpx.AsyncClient, service: Service, acme_domain: str
) -> None:
    """``Action: failed`` with a 4.x.x status (the relay gave up on a full
    mailbox): the recipient's outcome is ``failed`` and the address, a good
    one, is not suppressed."""
    email_id, message_id = await delivered_email(client, service, "gone@example.org")
    raw = (await report(service, "postfix_bounce.eml", message_id)).replace(
        b"Status: 5.1.1", b"Status: 4.2.2")
    answer = ok(await post_report(http, raw))
    assert [(r["recipient"], r["outcome"], r["code"]) for r in answer["reports"]][0] == (
        "gone@example.org", "failed", "4.2.2")
    found = [e for e in await events(client, email_id) if e["recipient"] == "gone@example.org"]
    assert "failed" in [e["type"] for e in found] and "bounced" not in [e["type"] for e in found]
    assert await suppressions(client) == {}


async def test_a_large_report_is_parsed_while_other_requests_are_answered(
    http: httpx.AsyncClient,
) -> None:
    """Parsing a report of megabytes takes seconds of CPU: it runs beside
    the event loop, which answers every other request meanwhile."""
    raw = (REPORTS / "postfix_bounce.eml").read_bytes()
    block = b"Final-Recipient: rfc822; gone@example.org\nAction: failed\nStatus: 5.1.1\n\n"
    at = raw.index(b"Final-Recipient: rfc822; slow@")
    raw = raw[:at] + block * 60_000 + raw[at:]  # 4.4 MB; refused once parsed
    waits: list[float] = []
    took = 0.0

    async def send_report() -> None:
        nonlocal took
        started = trio.current_time()
        assert_error(await post_report(http, raw), 422, "UNPROCESSABLE_ENTITY")
        took = trio.current_time() - started
        nursery.cancel_scope.cancel()

    async def probe() -> None:
        while True:
            started = trio.current_time()
            assert (await http.get("/healthz")).status_code == 200
            waits.append(trio.current_time() - started)
            await trio.sleep(0.02)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(probe)
        nursery.start_soon(send_report)
    assert took > 1.0, took  # long enough to show a stall
    # Parsed on the event loop, one wait would last about the whole parse;
    # beside it, none does (the upload of 4.4 MB, on a machine busy with
    # other tests, has delayed the first by a quarter of it).
    assert len(waits) > 10 and max(waits) < took / 2, (max(waits), took)
