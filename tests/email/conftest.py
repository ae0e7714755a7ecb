"""Email test fixtures: a verified sending domain for team acme."""

from __future__ import annotations

from uuid import UUID

import httpx
import pytest

from tests.conftest import Credential
from tests.email.helpers import ok
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
