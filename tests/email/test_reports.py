"""Parsing delivery status notifications and abuse reports."""

from __future__ import annotations

import base64
import quopri
from pathlib import Path
from uuid import UUID

import pytest

from tidings.email.bounce_addresses import BounceKey
from tidings.email.reports import NotAReport, Report, parse_report, parse_reports

HERE = Path(__file__).parent / "reports"
KEY = BounceKey(b"k" * 32)
ID = UUID("0f6c6f2e-3a1d-4a57-9a43-2b1c3d4e5f60")


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


def without_original(raw: bytes) -> bytes:
    """The report with its third part (the original's headers) left out."""
    head, _, rest = raw.partition(b"Content-Type: text/rfc822-headers")
    return head[: head.rindex(b"--")] + rest[rest.index(b"--"):]


def test_a_report_without_the_original_is_matched_by_its_return_path() -> None:
    """RFC 3464 and RFC 5965 make the original optional; the bounce address
    the report came back to names the email as well, in any case."""
    email_id = UUID("0f6c6f2e-3a1d-4a57-9a43-2b1c3d4e5f60")
    address = KEY.address(email_id, "gone@example.org", "bounces.acme.example")
    local, _, _ = address.partition("@")
    raw = without_original(sample("postfix_bounce.eml")).replace(
        b"To: b-0f6c@bounces.acme.example", f"To: {local.upper()}@Bounces.Acme.Example".encode(),
    )
    assert b"text/rfc822-headers" not in raw
    expected = f"<{email_id}@acme.example>"
    assert [r.original_message_id for r in parse_report(raw)] == [expected] * 2
    # Delivered-To (Postfix's pipe) is read before To.
    delivered = raw.replace(b"Auto-Submitted:", (
        f"Delivered-To: {local}@bounces.other.example\nAuto-Submitted:").encode())
    assert parse_report(delivered)[0].original_message_id == f"<{email_id}@other.example>"
    # An address that is not a bounce address names nothing, nor does the
    # untagged form of old (``<email id>@bounces.<domain>``).
    unknown = parse_report(without_original(sample("postfix_bounce.eml")))
    assert unknown[0].original_message_id is None
    old = without_original(sample("postfix_bounce.eml")).replace(
        b"To: b-0f6c@bounces.acme.example", f"To: {email_id}@bounces.acme.example".encode(),
    )
    assert parse_report(old)[0].original_message_id is None


def test_the_bounce_addresses_a_report_came_back_to() -> None:
    """The report's envelope headers and the attached original's Return-Path."""
    to_ada = KEY.address(ID, "ada@example.org", "bounces.acme.example")
    to_bo = KEY.address(ID, "bo@example.org", "bounces.acme.example")
    raw = sample("postfix_bounce.eml").replace(
        b"To: b-0f6c@bounces.acme.example", f"To: Bounces <{to_ada}>".encode()
    ).replace(b"Return-Path: <b-0f6c@bounces.acme.example>", f"Return-Path: <{to_bo}>".encode())
    found = parse_reports(raw).bounce_addresses
    assert [(a.email_id, a.domain) for a in found] == [(ID, "acme.example")] * 2
    assert KEY.vouches(found[0], ID, "ada@example.org")
    assert KEY.vouches(found[1], ID, "bo@example.org")
    assert not KEY.vouches(found[0], ID, "bo@example.org")
    assert parse_reports(sample("postfix_bounce.eml")).bounce_addresses == ()


@pytest.mark.parametrize("feedback", ["not-spam", "auth-failure", "Not-Spam"])
def test_a_feedback_report_that_is_no_complaint_reports_nothing(feedback: str) -> None:
    raw = sample("abuse_report.eml").replace(
        b"Feedback-Type: abuse", f"Feedback-Type: {feedback}".encode())
    assert b"Feedback-Type: abuse" not in raw
    assert parse_report(raw) == []
    fraud = sample("abuse_report.eml").replace(b"Feedback-Type: abuse", b"Feedback-Type: fraud")
    assert [r.outcome for r in parse_report(fraud)] == ["complained"]


def test_parts_nested_too_deeply_are_not_a_report() -> None:
    depth = 1000
    opening = "".join(
        f"Content-Type: multipart/mixed; boundary=\"b{i}\"\n\n--b{i}\n" for i in range(depth))
    raw = ("From: a@example.org\nMIME-Version: 1.0\n" + opening + "\nx\n").encode()
    with pytest.raises(NotAReport, match="nested"):
        parse_report(raw)


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


def test_a_status_or_feedback_type_is_kept_only_as_the_code_it_must_be() -> None:
    """The code of an event is what RFC 3464 and RFC 5965 allow there, never
    a field of any length (the rest of a DSN line is its diagnostic's)."""
    raw = sample("postfix_bounce.eml")
    for status, code in ((b"5.1.1 (user unknown)", "5.1.1"), (b"4.4.1 " + b"z" * 100_000, "4.4.1"),
                         (b"z" * 100_000, None), (b"5.1", None)):
        found = parse_report(raw.replace(b"Status: 5.1.1", b"Status: " + status))
        assert found[0].code == code, status[:20]
    # Only a valid 4.x.x makes a failed action a give-up rather than a bounce.
    found = parse_report(raw.replace(b"Status: 5.1.1", b"Status: 4.2.2"))
    assert found[0].outcome == "failed"
    arf = sample("abuse_report.eml")
    for feedback, code in ((b"fraud", "fraud"), (b"x" * 100_000, "other"), (b"ab use", "other")):
        found = parse_report(arf.replace(b"Feedback-Type: abuse", b"Feedback-Type: " + feedback))
        assert [(r.outcome, r.code) for r in found] == [("complained", code)]


def test_a_report_about_too_many_recipients_is_not_one() -> None:
    """Tidings sends one SMTP transaction per recipient: a report about
    thousands of them is no report of its mail, and parsing it would only
    cost CPU."""
    raw = sample("postfix_bounce.eml")
    block = b"Final-Recipient: rfc822; gone@example.org\nAction: failed\nStatus: 5.1.1\n\n"
    at = raw.index(b"Final-Recipient: rfc822; slow@")
    assert len(parse_report(raw[:at] + block * 998 + raw[at:])) == 1000  # and the sample's 2
    with pytest.raises(NotAReport, match="more than 1000 recipients"):
        parse_report(raw[:at] + block * 999 + raw[at:])
    arf = sample("abuse_report.eml")
    rcpts = b"".join(f"Original-Rcpt-To: r{i}@example.org\n".encode() for i in range(1001))
    with pytest.raises(NotAReport, match="more than 1000 recipients"):
        parse_report(arf.replace(b"Feedback-Type: abuse\n", b"Feedback-Type: abuse\n" + rcpts))


def test_a_report_sent_to_many_bounce_addresses_is_not_one() -> None:
    """A report comes back to one bounce address; each one it names is a
    check of every recipient it speaks of, so thousands are refused while
    parsing, not checked one by one."""
    raw = sample("postfix_bounce.eml")
    addresses = [KEY.address(ID, f"r{i}@example.org", "bounces.acme.example") for i in range(9)]
    eight = raw.replace(b"To: b-0f6c@bounces.acme.example",
                        ("To: " + ", ".join(addresses[:8])).encode())
    assert len(parse_reports(eight).bounce_addresses) == 8
    nine = raw.replace(b"To: b-0f6c@bounces.acme.example",
                       ("To: " + ", ".join(addresses)).encode())
    with pytest.raises(NotAReport, match="more than 8 bounce addresses"):
        parse_reports(nine)
    # The same address repeated in the envelope headers is one.
    again = raw.replace(b"To: b-0f6c@bounces.acme.example",
                        ("To: " + ", ".join([addresses[0]] * 50)).encode())
    assert len(parse_reports(again).bounce_addresses) == 1


@pytest.mark.parametrize("header", [b"To: ", b"Final-Recipient: rfc822; "])
def test_addresses_nested_too_deeply_are_not_a_report(header: bytes) -> None:
    raw = sample("postfix_bounce.eml")
    at = raw.index(b"To: b-0f6c") if header == b"To: " else raw.index(b"Final-Recipient: rfc822; g")
    end = raw.index(b"\n", at)
    with pytest.raises(NotAReport, match="nested"):
        parse_reports(raw[:at] + header + b"(" * 5000 + raw[end:])


def test_a_forwarded_recipient_keeps_the_address_the_sender_gave() -> None:
    raw = sample("postfix_bounce.eml").replace(
        b"Final-Recipient: rfc822; gone@example.org",
        b"Original-Recipient: rfc822; gone@example.org\n"
        b"Final-Recipient: rfc822; gone.forwarded@elsewhere.example",
    )
    found = parse_report(raw)[0]
    assert (found.recipient, found.original_recipient) == (
        "gone.forwarded@elsewhere.example", "gone@example.org")
    assert parse_report(sample("postfix_bounce.eml"))[0].original_recipient is None


def _global_dsn(encoding: str | None) -> bytes:
    """The sample DSN as RFC 6533 has it for mail sent with SMTPUTF8: its
    fields in UTF-8, in a message/global-delivery-status part."""
    raw = sample("postfix_bounce.eml").replace(
        b"report-type=delivery-status", b"report-type=global-delivery-status"
    ).replace(b"gone@example.org", "jürgen@example.org".encode())
    head, rest = raw.split(b"Content-Type: message/delivery-status\n\n", 1)
    fields, tail = rest.split(b"\n--4QxYz1abcd", 1)
    if encoding == "base64":
        fields = base64.encodebytes(fields)
    elif encoding == "quoted-printable":
        fields = quopri.encodestring(fields)
    declared = b"" if encoding is None else f"Content-Transfer-Encoding: {encoding}\n".encode()
    return (head + b"Content-Type: message/global-delivery-status\n" + declared + b"\n"
            + fields + b"\n--4QxYz1abcd" + tail)


@pytest.mark.parametrize("encoding", [None, "base64", "quoted-printable"])
def test_an_internationalised_dsn(encoding: str | None) -> None:
    reports = parse_report(_global_dsn(encoding))
    assert [(r.outcome, r.recipient, r.code) for r in reports] == [
        ("bounced", "jürgen@example.org", "5.1.1"),
        ("delivery_delayed", "slow@example.org", "4.4.1"),
    ]
    assert reports[0].message is not None and "jürgen@example.org" in reports[0].message
    assert {r.original_message_id for r in reports} == {"<abc@acme.example>"}


def test_a_global_dsn_whose_fields_cannot_be_decoded_is_not_a_report() -> None:
    head, rest = _global_dsn("base64").split(b"base64\n\n", 1)
    raw = head + b"base64\n\nA\n--4QxYz1abcd" + rest.split(b"\n--4QxYz1abcd", 1)[1]
    with pytest.raises(NotAReport, match="without its message/delivery-status part"):
        parse_report(raw)


def test_the_report_type_in_rfc_2231_form() -> None:
    raw = sample("postfix_bounce.eml").replace(
        b"report-type=delivery-status", b"report-type*=utf-8''delivery-status"
    )
    assert [r.outcome for r in parse_report(raw)] == ["bounced", "delivery_delayed"]
