"""The DNS records a sending domain publishes, and how a lookup's answer is judged.

Four records per domain:

- ``spf``: TXT at the return-path host ``bounces.<domain>`` (the MAIL FROM
  domain, which is what SPF checks): ``v=spf1 a:<mail host> ~all``.
- ``dkim``: TXT at ``<selector>._domainkey.<domain>`` with the public half of
  the domain's own 2048-bit RSA key.
- ``dmarc``: TXT at ``_dmarc.<domain>``: ``v=DMARC1; p=none;`` (any DMARC
  record counts: the owner may already have a stricter one).
- ``return_path``: MX at ``bounces.<domain>`` to the mail host, where delivery
  reports for the return path arrive.

A record's status is ``pending`` until it is first looked up, then
``verified``, ``missing`` (no such record) or ``mismatch`` (records are
there, none with the expected value). The domain is verified when SPF and
DKIM are.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

Purpose = Literal["spf", "dkim", "dmarc", "return_path"]
Status = Literal["pending", "verified", "missing", "mismatch"]
REQUIRED: frozenset[str] = frozenset({"spf", "dkim"})
RETURN_PATH_LABEL = "bounces"


def return_path_host(domain: str) -> str:
    return f"{RETURN_PATH_LABEL}.{domain}"


@dataclass(frozen=True)
class Record:
    type: Literal["TXT", "MX"]
    name: str
    value: str
    purpose: Purpose
    priority: int | None = None
    status: Status = "pending"
    checked_at: datetime | None = None
    # When ``status`` last became what it is (e.g. when a record disappeared).
    changed_at: datetime | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "name": self.name,
            "value": self.value,
            "purpose": self.purpose,
            "priority": self.priority,
            "status": self.status,
            "checked_at": None if self.checked_at is None else self.checked_at.isoformat(),
            "changed_at": None if self.changed_at is None else self.changed_at.isoformat(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        moments = {
            key: None if data.get(key) is None else datetime.fromisoformat(data[key])
            for key in ("checked_at", "changed_at")
        }
        return cls(
            type=data["type"],
            name=data["name"],
            value=data["value"],
            purpose=data["purpose"],
            priority=data.get("priority"),
            status=data.get("status", "pending"),
            **moments,
        )


def records_for(domain: str, selector: str, dkim_public: str, mail_host: str) -> list[Record]:
    """The records to publish for ``domain``; ``dkim_public`` is the base64 DER key."""
    bounces = return_path_host(domain)
    return [
        Record("TXT", bounces, f"v=spf1 a:{mail_host} ~all", "spf"),
        Record("TXT", f"{selector}._domainkey.{domain}", f"v=DKIM1; k=rsa; p={dkim_public}",
               "dkim"),
        Record("TXT", f"_dmarc.{domain}", "v=DMARC1; p=none;", "dmarc"),
        Record("MX", bounces, mail_host, "return_path", priority=10),
    ]


def _tags(text: str) -> dict[str, str]:
    tags: dict[str, str] = {}
    for part in text.split(";"):
        key, sep, value = part.partition("=")
        if sep:
            tags[key.strip().lower()] = re.sub(r"\s+", "", value)
    return tags


def judge(record: Record, answers: Sequence[str]) -> Status:
    """The status of ``record`` given what DNS holds at its name: the TXT
    strings (each record's strings joined) or the MX exchanges."""
    if not answers:
        return "missing"
    if record.purpose == "spf":
        spf = [a for a in answers if a.lower().startswith("v=spf1")]
        if not spf:
            return "missing"
        # The mechanism with the pass qualifier, written or not (``+`` is the
        # default, RFC 7208 §4.6.2); ``-a:``, ``~a:`` and ``?a:`` do not pass.
        wanted = record.value.split()[1].lower()
        passes = {wanted, f"+{wanted}"}
        return "verified" if any(passes & set(a.lower().split()) for a in spf) else "mismatch"
    if record.purpose == "dkim":
        wanted = _tags(record.value)["p"]
        return "verified" if any(_tags(a).get("p") == wanted for a in answers) else "mismatch"
    if record.purpose == "dmarc":
        dmarc = [a for a in answers if a.replace(" ", "").upper().startswith("V=DMARC1")]
        return "verified" if dmarc else "mismatch"
    exchanges = {a.lower().removesuffix(".") for a in answers}
    return "verified" if record.value.lower() in exchanges else "mismatch"


def with_statuses(
    records: Sequence[Record], statuses: Sequence[Status], now: datetime
) -> list[Record]:
    """``records`` after a check that found ``statuses`` (in the same order) at ``now``."""
    return [
        replace(
            record,
            status=status,
            checked_at=now,
            changed_at=record.changed_at if status == record.status else now,
        )
        for record, status in zip(records, statuses, strict=True)
    ]


def domain_status(records: Sequence[Record]) -> Literal["verified", "failed"]:
    """After a check: verified when the SPF and DKIM records are."""
    required = [r for r in records if r.purpose in REQUIRED]
    return "verified" if all(r.status == "verified" for r in required) else "failed"
