"""Verifying sending domains: at the owner's request, and again periodically.

With the sandbox email provider every record verifies at once (CONTRACT §9);
otherwise each record is looked up in DNS. A lookup that gets no answer
either way (timeout, SERVFAIL) changes nothing: only a definite answer can
make a record ``missing``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import trio

from tidings.config import Config
from tidings.email.dns import LookupFailed, Resolver, check
from tidings.email.records import Record, Status, domain_status, with_statuses
from tidings.storage import domains as store
from tidings.storage.db import Database
from tidings.storage.domains import Check, Domain

log = logging.getLogger("tidings.domains")

# Domains looked up at once by a periodic re-verification.
RECHECK_CONCURRENCY = 8
RECHECK_BATCH = 200


def resolver_for(config: Config) -> Resolver:
    return Resolver(config.dns_nameservers)


async def statuses_of(config: Config, records: Sequence[Record]) -> list[Status]:
    """What DNS holds for ``records`` now; raises LookupFailed when it cannot tell."""
    if config.email_provider == "sandbox":
        return ["verified"] * len(records)
    return await check(resolver_for(config), records)


def outcome(domain: Domain, statuses: Sequence[Status], *, guarded: bool = False) -> Check:
    """What the lookups found for ``domain``; ``guarded``: stored only if no
    other check was stored since ``domain`` was read."""
    records = with_statuses(domain.records, statuses, datetime.now(UTC))
    return Check(domain.id, records, domain_status(records), guarded, domain.last_checked_at)


@dataclass(frozen=True)
class Lapse:
    """A record of a verified domain that was verified and no longer is."""

    domain: Domain
    record: Record


async def recheck_due(db: Database, config: Config) -> list[Lapse]:
    """Look up again the records of verified domains not checked for
    ``config.domain_recheck_seconds``; store what was found and return the
    records that disappeared or changed. A domain whose SPF or DKIM record
    has gone becomes ``failed`` (it cannot send until verified again).

    Cancelled midway, nothing is stored for the domains of this round; they
    are due again at once.
    """
    async with db.acquire() as conn:
        due = await store.due_for_recheck(conn, config.domain_recheck_seconds, RECHECK_BATCH)
    if not due:
        return []
    checks: list[Check] = []
    limiter = trio.CapacityLimiter(RECHECK_CONCURRENCY)

    async def one(domain: Domain) -> None:
        async with limiter:
            try:
                statuses = await statuses_of(config, domain.records)
            except LookupFailed as error:
                log.warning("domain %s: re-verification inconclusive: %s", domain.name, error)
                return
        checks.append(outcome(domain, statuses, guarded=True))

    async with trio.open_nursery() as nursery:
        for domain in due:
            nursery.start_soon(one, domain)
    if not checks:
        return []
    async with db.acquire() as conn:
        stored = await store.record_checks(conn, checks)
    before = {domain.id: domain for domain in due}
    lapses: list[Lapse] = []
    for domain in stored:
        for old, new in zip(before[domain.id].records, domain.records, strict=True):
            if old.status == "verified" and new.status != "verified":
                log.warning(
                    "domain %s: the %s record %s %s is now %s",
                    domain.name, new.purpose, new.type, new.name, new.status,
                )
                lapses.append(Lapse(domain, new))
    return lapses


async def recheck_domains(db: Database, config: Config) -> None:
    """Re-verify due domains forever (a singleton of the runtime): every
    ``domain_recheck_seconds``, at most a minute apart. Several processes
    may look the same domain up at once, which only repeats a lookup."""
    while True:
        await recheck_due(db, config)
        await trio.sleep(min(config.domain_recheck_seconds, 60.0))
