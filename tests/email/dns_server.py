"""A small authoritative DNS server on 127.0.0.1 (UDP, trio sockets) answering
from a zone the test changes as it goes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset
import trio


@dataclass
class Zone:
    """``records[(name, type)]`` = rdata texts, e.g. ``('x.example', 'TXT')``:
    ``['"v=spf1 ..."']``. ``servfail`` makes every answer SERVFAIL;
    ``delay`` holds every answer back that many seconds (a slow name server),
    an answer from the zone as it was when asked."""

    records: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    servfail: bool = False
    delay: float = 0.0
    queries: list[tuple[str, str]] = field(default_factory=list)

    def txt(self, name: str, *values: str) -> None:
        # Long values are split in strings of at most 255 bytes, as a zone holds them.
        texts = []
        for value in values:
            chunks = [value[i:i + 255] for i in range(0, len(value), 255)] or [""]
            texts.append(" ".join(f'"{chunk}"' for chunk in chunks))
        self.records[(name, "TXT")] = texts

    def mx(self, name: str, *exchanges: str) -> None:
        self.records[(name, "MX")] = [f"10 {exchange}." for exchange in exchanges]

    def remove(self, name: str, kind: str) -> None:
        self.records.pop((name, kind), None)

    def answer(self, query: dns.message.Message) -> dns.message.Message:
        response = dns.message.make_response(query)
        response.flags |= dns.flags.AA
        if self.servfail:
            response.set_rcode(dns.rcode.SERVFAIL)
            return response
        question = query.question[0]
        name = question.name.to_text(omit_final_dot=True).lower()
        kind = dns.rdatatype.to_text(question.rdtype)
        self.queries.append((name, kind))
        if not any(known == name for known, _ in self.records):
            response.set_rcode(dns.rcode.NXDOMAIN)
            return response
        values = self.records.get((name, kind))
        if values:
            response.answer.append(
                dns.rrset.from_text_list(question.name, 60, dns.rdataclass.IN, kind, values)
            )
        return response


@asynccontextmanager
async def serve_dns(zone: Zone) -> AsyncIterator[tuple[str, int]]:
    """Serve ``zone`` until the block ends; yields the (host, port) to ask."""
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    await sock.bind(("127.0.0.1", 0))

    async def serve() -> None:
        while True:
            data, peer = await sock.recvfrom(4096)
            try:
                query = dns.message.from_wire(data)
            except dns.exception.DNSException:
                continue
            if zone.delay:
                nursery.start_soon(answer_later, zone.answer(query), zone.delay, peer)
            else:
                await sock.sendto(zone.answer(query).to_wire(), peer)

    async def answer_later(answer: dns.message.Message, delay: float, peer: Any) -> None:
        # The zone as it was when asked, arriving late (a slow network).
        await trio.sleep(delay)
        await sock.sendto(answer.to_wire(), peer)

    with sock:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            yield sock.getsockname()
            nursery.cancel_scope.cancel()
