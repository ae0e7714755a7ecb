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
from tidings.storage.emails_sending import Outcome, email_by_smtp_message_id, record_outcomes

PROVIDER = "smtp"


@dataclass(frozen=True)
class Handled:
    report: Report
    recorded: bool


async def record_report(conn: Any, raw: bytes) -> list[Handled]:
    """Parse ``raw`` (raises NotAReport) and record what it says about emails
    Tidings sent. Reports about messages Tidings does not know are returned
    with ``recorded`` False. Run it inside a transaction."""
    reports = parse_report(raw)
    emails = {}
    for message_id in {r.original_message_id for r in reports if r.original_message_id}:
        emails[message_id] = await email_by_smtp_message_id(conn, message_id)
    outcomes, handled = [], []
    for report in reports:
        email_id = emails.get(report.original_message_id or "")
        if email_id is not None:
            outcomes.append(Outcome(
                email_id, report.recipient, report.outcome, PROVIDER,
                code=report.code, message=report.message,
            ))
        handled.append(Handled(report, email_id is not None))
    await record_outcomes(conn, outcomes)
    return handled
