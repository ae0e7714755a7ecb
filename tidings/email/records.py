"""The DNS records a sending domain publishes, and how a lookup's answer is judged.

Four records per domain:

- ``spf``: TXT at the return-path host ``bounces.<domain>`` (the MAIL FROM
  domain, which is what SPF checks): ``v=spf1 a:<mail host> ~all``.
- ``dkim``: TXT at ``<selector>._domainkey.<domain>`` with the public half of
  the domain's own 2048-bit RSA key.
- ``dmarc``: TXT at ``_dmarc.<domain>``: ``v=DMARC1; p=none;`` (any single
  DMARC record counts: the owner may already have a stricter one).
- ``return_path``: MX at ``bounces.<domain>`` to the mail host, where delivery
  reports for the return path arrive.

A record's status is ``pending`` until it is first looked up, then
``verified``, ``missing`` (no such record) or ``mismatch`` (records are
there, but none that a receiver would use as we need, or several where a
receiver takes only one). The domain is verified when SPF and DKIM are.
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


# An SPF term (RFC 7208 §4.6.1, §5, §6), loosely: a mechanism with its
# qualifier, or a modifier. A term that is neither is a syntax error, and a
# receiver answers ``permerror`` for the whole record (§4.6).
SPF_MECHANISM = re.compile(
    r"[+?~-]?(all|(include|exists|ip4|ip6):\S+|ptr(:\S+)?|(a|mx)(:[^/\s]+)?(/\S+)?)"
)
SPF_MODIFIER = re.compile(r"[a-z][a-z0-9_.-]*=\S*")
DKIM_TAG_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def _spf_terms(text: str) -> list[str] | None:
    """The terms of an SPF record, lower-cased, or None when ``text`` is not
    one: it must begin with exactly ``v=spf1`` followed by a space or its end
    (RFC 7208 §4.5), so ``v=spf10`` is some other record."""
    version, *terms = text.lower().split(" ")
    return [term for term in terms if term] if version == "v=spf1" else None


# A mechanism's parts: its qualifier, its name, its domain and a CIDR length.
SPF_PARTS = re.compile(r"(?P<qualifier>[+?~-]?)(?P<name>[a-z0-9]+)(:(?P<domain>[^/\s]+))?(/\S*)?")


def _spf_passes(terms: list[str], host: str, name: str) -> bool:
    """Whether a receiver evaluating ``terms``, the SPF record at ``name``
    (``bounces.<domain>``), for mail from ``host`` (the mail host) comes to
    ``pass`` by our ``a:<host>``, and finds no syntax error.

    Mechanisms are evaluated in order and the first that matches decides
    (RFC 7208 §4.6.2), so one that matches the mail host with a qualifier
    other than ``+`` (the default) fails it before ``a:<host>`` is reached.
    Of those we can tell about: ``all``, which always matches and after
    which nothing is evaluated (§5.1); ``a:<host>``; and ``mx`` of ``name``,
    whose MX is the mail host once the return-path record we ask for is
    published. That one counts only against the record: the return-path
    record is not required, so a passing ``mx`` is no pass we can rely on.
    The others (``include``, ``exists``, ``ptr``, ``ip4``, ``ip6``, ``a`` and
    ``mx`` of other names) depend on records we do not look up, and are
    passed over."""
    if not all(SPF_MECHANISM.fullmatch(t) or SPF_MODIFIER.fullmatch(t) for t in terms):
        return False
    modifiers = [t.partition("=")[0] for t in terms if "=" in t]
    if modifiers.count("redirect") > 1 or modifiers.count("exp") > 1:
        return False  # permerror (§6)
    for term in terms:
        parts = SPF_PARTS.fullmatch(term)
        if SPF_MODIFIER.fullmatch(term) or parts is None:
            continue
        passing = parts["qualifier"] in ("", "+")
        # A receiver takes a host with a trailing dot as the same host.
        domain = (parts["domain"] or name).removesuffix(".")
        if parts["name"] == "all":
            return False
        if parts["name"] == "a" and domain == host:
            return passing
        if parts["name"] == "mx" and domain == name and not passing:
            return False
    return False


def _dkim_tags(text: str) -> dict[str, str] | None:
    """The tags of a DKIM tag list (RFC 6376 §3.2) in their order, values
    stripped, or None when it is not one: a part without ``=``, a malformed
    or repeated tag name. Names are case-sensitive."""
    parts = text.strip().split(";")
    if not parts[-1].strip():
        parts.pop()  # a trailing ``;`` is allowed
    tags: dict[str, str] = {}
    for part in parts:
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or not DKIM_TAG_NAME.fullmatch(name) or name in tags:
            return None
        tags[name] = value.strip()
    return tags


def _dkim_key(text: str) -> str | None:
    """The RSA key (``p=``, whitespace removed) of a DKIM key record that a
    receiver can verify our rsa-sha256 email signatures with (RFC 6376
    §3.6.1), or None: ``v=``, if there, is first and ``DKIM1``; ``k=``, if
    there, is ``rsa``; ``h=``, if there, lists ``sha256``; ``s=``, if there,
    lists ``email`` or ``*``."""
    tags = _dkim_tags(text)
    if tags is None or "p" not in tags:
        return None
    if "v" in tags and (next(iter(tags)) != "v" or tags["v"] != "DKIM1"):
        return None
    if tags.get("k", "rsa") != "rsa":
        return None
    if "h" in tags and "sha256" not in {h.strip() for h in tags["h"].split(":")}:
        return None
    if "s" in tags and not {"email", "*"} & {s.strip() for s in tags["s"].split(":")}:
        return None
    return re.sub(r"\s+", "", tags["p"])


def _is_dmarc(text: str) -> bool:
    """Whether ``text`` is a DMARC record: its first tag is ``v=DMARC1``, the
    value exactly that, ended by ``;`` or the record's end (RFC 7489 §6.3,
    §6.4; the ``v`` is an ABNF literal, so of either case)."""
    name, _, value = text.split(";", 1)[0].partition("=")
    return name.strip() in ("v", "V") and value.strip() == "DMARC1"


def judge(record: Record, answers: Sequence[str]) -> Status:
    """The status of ``record`` given what DNS holds at its name: the TXT
    strings (each record's strings joined) or the MX exchanges.

    ``verified`` only when a receiver could use what is there: a record it
    would discard, ignore or fail on is a ``mismatch``, and so is more than
    one record of the kind, since a receiver then errs or picks one."""
    if not answers:
        return "missing"
    if record.purpose == "spf":
        spf = [terms for a in answers if (terms := _spf_terms(a)) is not None]
        if not spf:
            return "missing"
        # Two SPF records are a permerror (RFC 7208 §4.5).
        host = record.value.split()[1].lower().removeprefix("a:")
        passes = len(spf) == 1 and _spf_passes(spf[0], host, record.name.lower())
        return "verified" if passes else "mismatch"
    if record.purpose == "dkim":
        # The selector's name is ours alone; with several records there a
        # receiver's choice is arbitrary (RFC 6376 §3.6.2.2: undefined).
        wanted = _dkim_key(record.value)
        keys = [_dkim_key(a) for a in answers]
        return "verified" if wanted is not None and keys == [wanted] else "mismatch"
    if record.purpose == "dmarc":
        # Several DMARC records: no policy at all (RFC 7489 §6.6.3).
        dmarc = [a for a in answers if _is_dmarc(a)]
        return "verified" if len(dmarc) == 1 else "mismatch"
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
