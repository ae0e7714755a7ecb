"""Delivery reports that arrive after the send: DSNs and abuse reports
turned into email outcomes (``bounced``, ``complained``, ...).

The recording itself (events, status, webhook events, suppressions, and
recording each outcome of a recipient once) is the emails group's
``record_outcomes``; this module only finds, for each report, the email it
is about, by the Message-ID Tidings gave it, and the recipient it names,
and records an outcome only for a recipient whose bounce address the report
came back to: an email to several recipients has one return path per
recipient, so a recipient who knows its own cannot report for another.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from tidings.addresses import normalize_address
from tidings.email.bounce_addresses import BounceAddress, BounceKey
from tidings.email.reports import Report, Reports
from tidings.fields import FieldError
from tidings.storage.email_outcomes import Outcome, SentEmail, record_outcomes, sent_email

PROVIDER = "smtp"


@dataclass(frozen=True)
class Handled:
    report: Report
    recorded: bool


def _folded(address: str) -> str | None:
    """``address`` as acceptance normalises it (the domain in one form whether
    given as A-labels or U-labels), folded for comparison; None when it is no
    address. A report may name the mailbox in spellings acceptance refuses
    and RFC 5321 holds to be the same: a domain ending in a dot (the root),
    a local part in quotes that needs none (``"ada"@example.org``)."""
    for spelling in _spellings(address):
        try:
            return normalize_address(spelling).lower()
        except FieldError:
            continue
    return None


def _spellings(address: str) -> list[str]:
    local, at, domain = address.rpartition("@")
    if not at:
        return [address]
    if domain.endswith(".") and not domain.endswith(".."):
        domain = domain[:-1]
    if len(local) >= 2 and local[0] == local[-1] == '"':
        local = re.sub(r"\\(.)", r"\1", local[1:-1])
    return [address, f"{local}@{domain}"]


def _message_ids(report: Report, came_back_to: tuple[BounceAddress, ...]) -> list[str]:
    """The Message-IDs of the email ``report`` may be about: the original's, as
    the report gives it, then those the bounce addresses it came back to stand
    for (a relay may have written its own Message-ID on the original; the
    bounce address still names the email, and vouches for its recipient)."""
    ids = [report.original_message_id] if report.original_message_id else []
    ids += [f"<{a.email_id}@{a.domain}>" for a in came_back_to]
    return list(dict.fromkeys(ids))


def _recipients(email: SentEmail) -> dict[str, str]:
    """The email's recipients as sent, by their folded normalised address."""
    return {_folded(sent) or key: sent for key, sent in email.sent_to.items()}


def _vouched(
    key: BounceKey, addresses: tuple[BounceAddress, ...], email_id: UUID, recipient: str
) -> bool:
    """True when the report came back to the bounce address of ``email_id``
    to ``recipient``."""
    return any(key.vouches(a, email_id, recipient) for a in addresses)


def _vouched_recipient(
    key: BounceKey, addresses: tuple[BounceAddress, ...],
    found: tuple[SentEmail, dict[str, str]], report: Report,
) -> str | None:
    """The recipient of the email (as sent) that the report speaks of, when
    the report came back to that recipient's bounce address: the one it
    names, or the one the sender gave when the mail was forwarded on."""
    email, recipients = found
    for named in (report.recipient, report.original_recipient):
        folded = None if named is None else _folded(named)
        recipient = None if folded is None else recipients.get(folded)
        if recipient is not None and _vouched(key, addresses, email.id, recipient):
            return recipient
    return None


async def record_report(conn: Any, parsed: Reports, key: BounceKey) -> list[Handled]:
    """Record what a report (``parse_reports``) says about emails
    Tidings sent, for recipients they were sent to, when it came back to that
    recipient's bounce address (made with ``key``). Anything else (a message
    Tidings does not know, one not sent yet or never, an address it was not
    sent to, a report that did not come back to the address's own bounce
    address, an outcome recorded for that recipient already) is returned with
    ``recorded`` False: a report cannot suppress an address or move an email
    that no send reached, a recipient cannot report for another, and a
    report repeated is no new outcome. Run it inside a transaction."""
    reports = parsed.reports
    emails: dict[str, tuple[SentEmail, dict[str, str]] | None] = {}
    outcomes: list[Outcome | None] = []
    for report in reports:
        found = None
        for message_id in _message_ids(report, parsed.bounce_addresses):
            if message_id not in emails:
                email = await sent_email(conn, message_id)
                emails[message_id] = None if email is None else (email, _recipients(email))
            if (found := emails[message_id]) is not None:
                break
        recipient = None if found is None else _vouched_recipient(
            key, parsed.bounce_addresses, found, report
        )
        outcomes.append(None if found is None or recipient is None else Outcome(
            found[0].id, recipient, report.outcome, PROVIDER,
            code=report.code, message=report.message,
        ))
    recorded = iter(await record_outcomes(conn, [o for o in outcomes if o is not None]))
    return [
        Handled(report, outcome is not None and next(recorded))
        for report, outcome in zip(reports, outcomes, strict=True)
    ]
