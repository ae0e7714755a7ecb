"""Delivery reports that arrive after the send: DSNs and abuse reports
turned into email outcomes (``bounced``, ``complained``, ...).

The recording itself (events, status, webhook events, suppressions) is the
emails group's ``record_outcomes``; this module only finds, for each report,
the email it is about, by the Message-ID Tidings gave it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tidings.email.reports import Report, parse_report
from tidings.storage.emails_sending import Outcome, SentEmail, record_outcomes, sent_email

PROVIDER = "smtp"


@dataclass(frozen=True)
class Handled:
    report: Report
    recorded: bool


async def record_report(conn: Any, raw: bytes) -> list[Handled]:
    """Parse ``raw`` (raises NotAReport) and record what it says about emails
    Tidings sent, for recipients they were sent to. Anything else (a message
    Tidings does not know, one not sent yet or never, an address it was not
    sent to) is returned with ``recorded`` False: a report cannot suppress an
    address or move an email that no send reached. Run it inside a transaction."""
    reports = parse_report(raw)
    emails: dict[str, SentEmail | None] = {}
    for message_id in {r.original_message_id for r in reports if r.original_message_id}:
        emails[message_id] = await sent_email(conn, message_id)
    outcomes, handled = [], []
    for report in reports:
        email = emails.get(report.original_message_id or "")
        recipient = None if email is None else email.sent_to.get(report.recipient.lower())
        if email is not None and recipient is not None:
            outcomes.append(Outcome(
                email.id, recipient, report.outcome, PROVIDER,
                code=report.code, message=report.message,
            ))
        handled.append(Handled(report, recipient is not None))
    await record_outcomes(conn, outcomes)
    return handled
