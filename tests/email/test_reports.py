"""Parsing delivery status notifications and abuse reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidings.email.reports import NotAReport, Report, parse_report

HERE = Path(__file__).parent / "reports"


def sample(name: str, message_id: str = "abc@acme.example") -> bytes:
    return (HERE / name).read_bytes().replace(b"MESSAGE_ID", message_id.encode())


def test_postfix_dsn() -> None:
    assert parse_report(sample("postfix_bounce.eml")) == [
        Report(
            outcome="bounced", recipient="gone@example.org",
            original_message_id="<abc@acme.example>", code="5.1.1",
            message="smtp; 550 5.1.1 <gone@example.org>: Recipient address rejected: "
                    "User unknown in local recipient table",
        ),
        Report(
            outcome="delivery_delayed", recipient="slow@example.org",
            original_message_id="<abc@acme.example>", code="4.4.1",
            message="X-Postfix; connect to mx.example.org[192.0.2.11]:25: Connection timed out",
        ),
    ]


def test_dsn_with_the_whole_original_message() -> None:
    raw = sample("postfix_bounce.eml").replace(
        b"Content-Type: text/rfc822-headers", b"Content-Type: message/rfc822"
    )
    reports = parse_report(raw)
    assert [r.original_message_id for r in reports] == ["<abc@acme.example>"] * 2


def test_arf_report() -> None:
    assert parse_report(sample("abuse_report.eml")) == [
        Report(
            outcome="complained", recipient="Ada@Example.ORG",
            original_message_id="<abc@acme.example>", code="abuse",
            message="abuse report from ExampleFBL/2.0",
        )
    ]


def test_arf_without_original_rcpt_to_uses_the_original_to() -> None:
    raw = sample("abuse_report.eml").replace(b"Original-Rcpt-To: <Ada@Example.ORG>\n", b"")
    assert [r.recipient for r in parse_report(raw)] == ["Ada@Example.ORG"]


def test_not_reports() -> None:
    plain = b"From: a@example.org\nTo: b@example.org\nSubject: hi\n\nhello\n"
    other = sample("abuse_report.eml").replace(b"feedback-report;", b"disposition-notification;")
    broken = sample("postfix_bounce.eml").replace(b"message/delivery-status", b"text/plain")
    for raw in (plain, other, broken, b"", b"\x00\xff garbage"):
        with pytest.raises(NotAReport):
            parse_report(raw)


def test_a_long_diagnostic_is_cut() -> None:
    raw = sample("postfix_bounce.eml").replace(
        b"Diagnostic-Code: smtp; 550", b"Diagnostic-Code: smtp; 550 " + b"z" * 100_000
    )
    found = parse_report(raw)
    assert found[0].message is not None and len(found[0].message) == 1000
    assert found[0].message.endswith("…") and found[0].code == "5.1.1"
