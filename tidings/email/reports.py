"""Delivery status notifications (RFC 3464) and abuse reports (ARF, RFC 5965).

Both are ``multipart/report`` messages: a human-readable part, a
machine-readable part (``message/delivery-status``, its internationalised
form ``message/global-delivery-status`` (RFC 6533) for mail sent with
SMTPUTF8, or ``message/feedback-report``) and the original message or its
headers. What
Tidings needs of them is, per recipient, the original ``Message-ID`` and
what happened: a bounce, a delay, a delivery or a complaint, with the status
and the diagnostic the reporting server gave; and of the whole report, the
bounce addresses it came back to (``tidings.email.bounce_addresses``),
which say for which recipient it may speak. Parsed with the standard
library's ``email`` package.
"""

from __future__ import annotations

import base64
import binascii
import email
import email.policy
import quopri
import re
from dataclasses import dataclass
from email.header import Header, decode_header
from email.message import Message
from email.parser import HeaderParser
from email.utils import collapse_rfc2231_value, decode_rfc2231, getaddresses
from typing import Literal
from urllib.parse import unquote

from tidings.email.bounce_addresses import BounceAddress, parse_bounce_address

Outcome = Literal["bounced", "delivery_delayed", "delivered", "complained", "failed"]

# The DSN Action of a recipient, and what it means for the email.
ACTIONS: dict[str, Outcome] = {
    "failed": "bounced",
    "delayed": "delivery_delayed",
    "delivered": "delivered",
    "relayed": "delivered",
    "expanded": "delivered",
}


# Feedback reports that are no complaint: a receiver saying a message is
# not spam (RFC 6430), an authentication failure report (RFC 6591). Every
# other type (abuse, fraud, virus, other, and types to come, which RFC 5965
# §7.3 reads as ``other``) is one.
NOT_COMPLAINTS = frozenset({"not-spam", "auth-failure"})


class NotAReport(ValueError):
    """The message is neither a delivery status notification nor an abuse report."""


@dataclass(frozen=True)
class Report:
    """What a report says about one recipient of one original message."""

    outcome: Outcome
    recipient: str
    original_message_id: str | None
    # The DSN Status (``5.1.1``) or the ARF Feedback-Type (``abuse``).
    code: str | None
    # The Diagnostic-Code (``smtp; 550 5.1.1 no such user``) or the report's own words.
    message: str | None
    # The recipient as the original's sender gave it, when a DSN names it
    # apart (RFC 3464 §2.3.1: ``Original-Recipient``; ``recipient`` is then
    # where the mail went, a forwarding address perhaps).
    original_recipient: str | None = None


def _field(value: object) -> str | None:
    """A header field's value as text. The parser gives a field with raw
    8-bit bytes (an internationalised address, RFC 6533) as a ``Header``:
    its bytes are read as UTF-8."""
    if value is None:
        return None
    if not isinstance(value, Header):
        return str(value)
    return "".join(
        part.decode("utf-8" if charset in (None, "unknown-8bit") else charset, "replace")
        if isinstance(part, bytes) else part
        for part, charset in decode_header(value)
    )


def _address(value: object) -> str | None:
    """The address of a ``type; address`` field (``rfc822; ada@example.org``);
    None for one that holds a NUL (no address does, and storage cannot)."""
    field = _field(value)
    if not field or "\x00" in field:
        return None
    _, _, rest = field.partition(";")
    addresses = getaddresses([(rest or field).strip()])
    address = addresses[0][1] if addresses else ""
    return address.strip().strip("<>") or None


def _text(value: object) -> str | None:
    """A field as one line of text, without NUL characters (storage cannot hold them)."""
    field = _field(value)
    if field is None:
        return None
    return " ".join(field.replace("\x00", " ").split()) or None


# A diagnostic longer than this is cut (with "…"): a reply is a line or two.
MAX_DIAGNOSTIC = 1000
# A report about more recipients than this is no report of Tidings' mail,
# which goes out in one SMTP transaction per recipient (docs/email.md).
MAX_RECIPIENTS = 1000
# A report comes back to one bounce address, which its envelope headers may
# repeat: more than this is no report of Tidings' mail either (and each one
# is a check of every recipient named).
MAX_BOUNCE_ADDRESSES = 8
# A DSN Status (RFC 3464 §2.3.4, RFC 3463): class, subject, detail.
_STATUS = re.compile(r"[245]\.\d{1,3}\.\d{1,3}")
# An ARF Feedback-Type (RFC 5965 §3.1): a token.
_FEEDBACK_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+-]{0,63}")


def _status(value: object) -> str | None:
    """The Status code, when the field is one (``5.1.1``), whatever comment follows it."""
    text = _text(value)
    found = _STATUS.match(text or "")
    return found.group(0) if found else None


def _shortened(text: str | None) -> str | None:
    if text is None or len(text) <= MAX_DIAGNOSTIC:
        return text
    return text[: MAX_DIAGNOSTIC - 1] + "…"


def _parts(message: Message) -> list[Message]:
    payload = message.get_payload()
    if not isinstance(payload, list):
        return []
    return [part for part in payload if isinstance(part, Message)]


def _original_headers(report: Message) -> Message | None:
    """The headers of the original message: its message/rfc822 or text/rfc822-headers part."""
    for part in _parts(report)[1:]:
        kind = part.get_content_type()
        if kind in ("message/rfc822", "message/global"):
            inner = _parts(part)
            if inner:
                return inner[0]
            payload = part.get_payload()
            if isinstance(payload, str):
                return HeaderParser().parsestr(payload)
        if kind in ("text/rfc822-headers", "message/global-headers"):
            content = part.get_payload(decode=True)
            if isinstance(content, bytes):
                return HeaderParser().parsestr(content.decode("utf-8", "replace"))
    return None


def _machine_part(report: Message, kind: str) -> list[Message]:
    """The field blocks of the report's second part (``message/delivery-status``
    parses into one block per message and per recipient)."""
    for part in _parts(report):
        if part.get_content_type() != kind:
            continue
        blocks = _parts(part)
        if blocks:
            return blocks
        payload = part.get_payload()
        if isinstance(payload, str):
            return [HeaderParser().parsestr(payload)]
    return []


# The blank lines between the field blocks of a delivery-status part.
_BLOCK_BREAK = re.compile(rb"\r?\n[ \t]*\r?\n")


def _global_blocks(report: Message) -> list[Message]:
    """The field blocks of a ``message/global-delivery-status`` part (RFC
    6533 §6.3): UTF-8 fields, possibly base64 or quoted-printable, which the
    standard library parses as one enclosed message (its first block as the
    headers, the others as the body) rather than block by block."""
    for part in _parts(report):
        if part.get_content_type() != "message/global-delivery-status":
            continue
        enclosed = _parts(part)
        if enclosed:
            data = enclosed[0].as_bytes()  # the part's text as received
        else:
            payload = part.get_payload(decode=True)
            data = payload if isinstance(payload, bytes) else b""
        encoding = str(part.get("Content-Transfer-Encoding", "")).strip().lower()
        try:
            if encoding == "base64":
                data = base64.b64decode(data)
            elif encoding == "quoted-printable":
                data = quopri.decodestring(data)
        except (binascii.Error, ValueError):
            return []
        return [email.message_from_bytes(block.strip(b"\r\n"), policy=email.policy.compat32)
                for block in _BLOCK_BREAK.split(data) if block.strip()]
    return []


# A msg-id (RFC 5322 §3.6.4): what is between the angle brackets, without
# the comments and folding that may surround it.
_MSG_ID = re.compile(r"<[^<>\s]+>")


def _message_id(headers: Message | None) -> str | None:
    """The original's Message-ID, as Tidings writes them (lowercase: the
    email's id and its domain), whatever case or comments a relay gave it."""
    if headers is None:
        return None
    value = _field(headers.get("Message-ID"))
    if value is None or "\x00" in value:
        return None
    found = _MSG_ID.search(value)
    return found.group(0).lower() if found else _text(value)


# Where an MTA names the address a message was delivered to: the report's
# own recipient, which for a report is the original's envelope sender.
ENVELOPE_HEADERS = ("X-Original-To", "Delivered-To", "Envelope-To", "To")


def _addresses(headers: Message | None, names: tuple[str, ...]) -> list[str]:
    if headers is None:
        return []
    return [address for name in names for value in headers.get_all(name) or []
            for _, address in getaddresses([_field(value) or ""]) if address]


def _bounce_addresses(report: Message, original: Message | None) -> tuple[BounceAddress, ...]:
    """The bounce addresses the report came back to: in its envelope headers,
    and the attached original's Return-Path (an ARF report attaches the
    message as delivered)."""
    found = (parse_bounce_address(a) for a in
             _addresses(report, ENVELOPE_HEADERS) + _addresses(original, ("Return-Path",)))
    addresses = tuple(dict.fromkeys(a for a in found if a is not None))
    if len(addresses) > MAX_BOUNCE_ADDRESSES:
        raise NotAReport(f"a report sent to more than {MAX_BOUNCE_ADDRESSES} bounce addresses")
    return addresses


def _by_return_path(report: Message) -> str | None:
    """The Message-ID Tidings gave the original, from the bounce address the
    report was sent to (its email id and domain stand for ``<email id@domain>``):
    a report need not carry the original (RFC 3464 §2, RFC 5965 §2 make it
    optional)."""
    for address in _addresses(report, ENVELOPE_HEADERS):
        bounce = parse_bounce_address(address)
        if bounce is not None:
            return f"<{bounce.email_id}@{bounce.domain}>"
    return None


def _original_message_id(report: Message) -> str | None:
    return _message_id(_original_headers(report)) or _by_return_path(report)


def _dsn(report: Message) -> list[Report]:
    blocks = _machine_part(report, "message/delivery-status") or _global_blocks(report)
    if not blocks:
        raise NotAReport("a delivery-status report without its message/delivery-status part")
    original = _original_message_id(report)
    if len(blocks) - 1 > MAX_RECIPIENTS:
        raise NotAReport(f"a report about more than {MAX_RECIPIENTS} recipients")
    found: list[Report] = []
    for block in blocks[1:]:
        given = _address(block.get("Original-Recipient"))
        recipient = _address(block.get("Final-Recipient")) or given
        action = (_field(block.get("Action")) or "").strip().lower()
        outcome = ACTIONS.get(action)
        if recipient is None or outcome is None:
            continue
        status = _status(block.get("Status"))
        if outcome == "bounced" and (status or "").startswith("4."):
            # Given up on after transient failures (a full mailbox, 4.2.2): not
            # delivered, but the address is good. ``failed``, not suppressed.
            outcome = "failed"
        found.append(Report(
            outcome=outcome,
            recipient=recipient,
            original_message_id=original,
            code=status,
            message=_shortened(_text(block.get("Diagnostic-Code"))),
            original_recipient=given if given != recipient else None,
        ))
    return found


def _arf(report: Message) -> list[Report]:
    blocks = _machine_part(report, "message/feedback-report")
    if not blocks:
        raise NotAReport("a feedback report without its message/feedback-report part")
    fields = blocks[0]
    headers = _original_headers(report)
    recipients = [a for a in (_address(v) for v in fields.get_all("Original-Rcpt-To") or []) if a]
    if not recipients and headers is not None:
        recipients = [address for _, address in getaddresses(
                          [_field(v) or "" for v in headers.get_all("To") or []])
                      if address and "\x00" not in address]
    if len(recipients) > MAX_RECIPIENTS:
        raise NotAReport(f"a report about more than {MAX_RECIPIENTS} recipients")
    given = _text(fields.get("Feedback-Type")) or "abuse"
    # A type that is no token is read as ``other`` (RFC 5965 §7.3): a complaint.
    feedback = given if _FEEDBACK_TYPE.fullmatch(given) else "other"
    if feedback.lower() in NOT_COMPLAINTS:
        return []
    summary = _shortened(_text(fields.get("User-Agent")))
    original = _message_id(headers) or _by_return_path(report)
    return [
        Report(
            outcome="complained",
            recipient=recipient,
            original_message_id=original,
            code=feedback,
            message=f"{feedback} report" + (f" from {summary}" if summary else ""),
        )
        for recipient in recipients
    ]


@dataclass(frozen=True)
class Reports:
    """A report message: what it says per recipient, and the bounce addresses
    it came back to, which vouch for the recipients it may speak of."""

    reports: list[Report]
    bounce_addresses: tuple[BounceAddress, ...]


def parse_reports(raw: bytes) -> Reports:
    """Every recipient a DSN or an ARF report speaks of, with the bounce
    addresses it came back to; NotAReport when it is neither."""
    try:
        return _parsed(raw)
    except RecursionError:
        # MIME parts, or the comments of an address, nested deeper than the
        # standard library's parsers go.
        raise NotAReport("nested too deeply to be a report") from None


def _report_type(message: Message) -> str:
    """The ``report-type`` parameter, also in RFC 2231's form
    (``report-type*=utf-8''delivery-status``), which the standard library
    decodes only for names without a hyphen."""
    value = message.get_param("report-type")
    if value is None:
        encoded = message.get_param("report-type*")
        if isinstance(encoded, str):
            value = unquote(decode_rfc2231(encoded)[-1])  # the report types are ASCII
    return collapse_rfc2231_value(value or "").strip().lower()


def _parsed(raw: bytes) -> Reports:
    message = email.message_from_bytes(raw, policy=email.policy.compat32)
    if message.get_content_type() != "multipart/report":
        raise NotAReport(f"not a multipart/report message but {message.get_content_type()}")
    kind = _report_type(message)
    if kind in ("delivery-status", "global-delivery-status"):
        found = _dsn(message)
    elif kind == "feedback-report":
        found = _arf(message)
    else:
        raise NotAReport(f"a report of type {kind or 'unknown'}, neither delivery-status "
                         "nor feedback-report")
    return Reports(found, _bounce_addresses(message, _original_headers(message)))


def parse_report(raw: bytes) -> list[Report]:
    """Every recipient a DSN or an ARF report speaks of; NotAReport otherwise."""
    return parse_reports(raw).reports
