"""DNS lookups for domain verification, with dnspython on trio.

``TIDINGS_DNS_NAMESERVERS`` picks the servers; without it, the system's
resolver configuration. Nothing is cached: each check asks again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import dns.asyncresolver
import dns.exception
import dns.nameserver
import dns.rdatatype
import dns.resolver
import trio

from tidings.email.records import Record, Status, judge

log = logging.getLogger(__name__)

TIMEOUT_SECONDS = 5.0

Nameserver = tuple[str, int]


class LookupFailed(Exception):
    """DNS gave no answer either way (timeout, SERVFAIL, refused): the record's
    state is unknown, which is not the same as missing."""


def _kind(error: dns.exception.DNSException) -> str:
    if isinstance(error, dns.resolver.LifetimeTimeout | dns.exception.Timeout):
        return "no name server answered in time"
    if isinstance(error, dns.resolver.NoNameservers):
        return "every name server failed to answer (SERVFAIL, REFUSED or a bad answer)"
    return f"the lookup failed ({type(error).__name__})"


class Resolver:
    """Answers TXT and MX questions for the verification of domains."""

    def __init__(
        self, nameservers: Sequence[Nameserver] = (), timeout: float = TIMEOUT_SECONDS
    ) -> None:
        self._resolver = dns.asyncresolver.Resolver(configure=not nameservers)
        if nameservers:
            self._resolver.nameservers = [
                dns.nameserver.Do53Nameserver(host, port) for host, port in nameservers
            ]
        self._resolver.lifetime = timeout
        self._resolver.cache = None

    async def answers(self, record_type: str, name: str) -> list[str]:
        """The TXT strings (each record's strings joined) or MX exchanges at ``name``;
        empty when there are none."""
        try:
            answer = await self._resolver.resolve(
                name, record_type, search=False, raise_on_no_answer=False
            )
        except dns.resolver.NXDOMAIN:
            return []
        except dns.exception.DNSException as error:
            # The kind of failure, not dnspython's words: they name the
            # operator's name servers ("Server Do53:10.0.0.2@53 answered
            # SERVFAIL"), which a team has no business knowing.
            log.warning("DNS lookup of %s %s failed: %s", record_type, name, error)
            raise LookupFailed(f"{record_type} {name}: {_kind(error)}") from error
        found: list[str] = []
        for rdata in answer.rrset or ():
            if rdata.rdtype == dns.rdatatype.TXT:
                found.append(b"".join(rdata.strings).decode("utf-8", "replace"))
            elif rdata.rdtype == dns.rdatatype.MX:
                found.append(rdata.exchange.to_text(omit_final_dot=True))
        return found


async def check(resolver: Resolver, records: Sequence[Record]) -> list[Status]:
    """Look every record up at once; their statuses in the same order.

    Raises LookupFailed if any lookup got no answer either way.
    """
    statuses: list[Status] = ["pending"] * len(records)
    failures: list[LookupFailed] = []

    async def one(index: int, record: Record) -> None:
        try:
            statuses[index] = judge(record, await resolver.answers(record.type, record.name))
        except LookupFailed as error:
            failures.append(error)

    async with trio.open_nursery() as nursery:
        for index, record in enumerate(records):
            nursery.start_soon(one, index, record)
    if failures:
        raise failures[0]
    return statuses
