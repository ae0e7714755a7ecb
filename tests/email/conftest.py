"""Email test fixtures: a verified sending domain for team acme, an SMTP
sink on loopback (``sink``, ``port``: a module overrides ``sink`` for one
that answers otherwise) and a name server on loopback (``zone``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from uuid import UUID

import httpx
import pytest

from tests.conftest import Credential
from tests.email.dns_server import Zone, serve_dns
from tests.email.helpers import ok
from tests.email.smtp_sink import Sink, running_sink
from tidings.config import Config, SmtpUrl, parse_smtp_url
from tidings.service import Service
from tidings.storage import domains as domain_store


async def verified_domain(
    service: Service, base_url: str, credential: Credential, name: str
) -> str:
    """Add ``name`` to the credential's team and mark it verified, as a DNS check would."""
    async with httpx.AsyncClient(base_url=base_url, headers=credential.headers) as client:
        created = ok(await client.post("/domains", json={"name": name}), 201)
    async with service.db.acquire() as conn:
        domain = await domain_store.get_domain(conn, credential.team_id, UUID(created["id"]))
        assert domain is not None
        await domain_store.record_checks(
            conn, [domain_store.Check(domain.id, domain.records, "verified")]
        )
    return name


@pytest.fixture
async def acme_domain(service: Service, base_url: str, acme: Credential) -> str:
    """``acme.example``, a verified sending domain of team acme."""
    return await verified_domain(service, base_url, acme, "acme.example")


@pytest.fixture
async def bucher_domain(service: Service, base_url: str, acme: Credential) -> str:
    """``bücher.example`` (stored as ``xn--bcher-kva.example``), verified for acme."""
    return await verified_domain(service, base_url, acme, "bücher.example")


def dns_config(database_url: str, nameserver: tuple[str, int], pool: int = 4) -> Config:
    """The SMTP provider verifying domains against a name server on loopback;
    nothing is sent (the relay is never reached)."""
    return Config(
        database_url=database_url, db_pool_size=pool, rate_limit_per_second=0,
        shutdown_grace_seconds=2, email_provider="smtp", dns_nameservers=(nameserver,),
        mail_host="mx.tidings.example",
        smtp_url=SmtpUrl("127.0.0.1", 9, implicit_tls=False, starttls="off"),
    )


def smtp_config(database_url: str, port: int) -> Config:
    """The SMTP provider pointed at a sink on ``port``, with quick retries."""
    return Config(
        database_url=database_url, db_pool_size=6, rate_limit_per_second=0,
        shutdown_grace_seconds=2, email_provider="smtp", email_poll_seconds=0.2,
        smtp_url=parse_smtp_url(f"smtp://127.0.0.1:{port}?starttls=off"),
        email_retry_schedule=(0.2, 0.2),
    )


@pytest.fixture
def sink() -> Sink:
    return Sink()


@pytest.fixture
def port(sink: Sink) -> Iterator[int]:
    with running_sink(sink) as port:
        yield port


@pytest.fixture
async def zone() -> AsyncIterator[tuple[Zone, tuple[str, int]]]:
    found = Zone()
    async with serve_dns(found) as address:
        yield found, address
