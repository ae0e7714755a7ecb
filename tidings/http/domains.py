"""Sending domains over HTTP: the records to publish, and their verification.

The DKIM private key never appears in a response.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

import trio
from pydantic import BaseModel, Field, field_validator

from tidings.email import dkim
from tidings.email.dns import LookupFailed
from tidings.email.names import sending_domain_name
from tidings.email.records import Purpose, Status, records_for
from tidings.email.verification import outcome, statuses_of
from tidings.http.envelope import ApiError, conflict, not_found
from tidings.http.models import RequestBody
from tidings.http.paging import Paging, page
from tidings.http.routing import Answer, Call, Finish, Routes
from tidings.storage import domains as store
from tidings.storage.connection import Connection
from tidings.storage.errors import Duplicate

routes = Routes("Domains")


class CreateDomain(RequestBody):
    name: str = Field(
        min_length=1, max_length=300,
        description="The domain to send from, e.g. example.com. An internationalised "
        "name is stored and shown in its ASCII (xn--) form.",
    )

    @field_validator("name")
    @classmethod
    def valid_name(cls, value: str) -> str:
        return sending_domain_name(value)


class RecordOut(BaseModel):
    type: Literal["TXT", "MX"]
    name: str = Field(description="The full DNS name to publish the record at")
    value: str
    purpose: Purpose
    priority: int | None = Field(description="MX only")
    status: Status = Field(description="pending until first looked up")
    checked_at: datetime | None
    changed_at: datetime | None = Field(description="When the status last changed")


class DomainOut(BaseModel):
    object: Literal["domain"] = "domain"
    id: UUID
    name: str
    status: store.DomainStatus
    records: list[RecordOut]
    created_at: datetime
    updated_at: datetime
    verified_at: datetime | None
    last_checked_at: datetime | None

    @classmethod
    def of(cls, domain: store.Domain) -> DomainOut:
        return cls(
            id=domain.id,
            name=domain.name,
            status=domain.status,
            records=[
                RecordOut(
                    type=r.type, name=r.name, value=r.value, purpose=r.purpose,
                    priority=r.priority, status=r.status, checked_at=r.checked_at,
                    changed_at=r.changed_at,
                )
                for r in domain.records
            ],
            created_at=domain.created_at,
            updated_at=domain.updated_at,
            verified_at=domain.verified_at,
            last_checked_at=domain.last_checked_at,
        )


class DomainList(BaseModel):
    object: Literal["list"] = "list"
    data: list[DomainOut]
    has_more: bool


@routes.route(
    "POST", "/domains", summary="Add a sending domain: the DNS records to publish",
    permission="domains:write", body=CreateDomain, response=DomainOut, status=201,
)
async def create_domain(call: Call, body: CreateDomain) -> DomainOut:
    private_key = await trio.to_thread.run_sync(dkim.new_private_key)
    selector = dkim.new_selector()
    records = records_for(
        body.name, selector, dkim.public_key_base64(private_key), call.service.config.mail_host
    )
    try:
        domain = await store.create_domain(
            call.conn, call.team_id, body.name, selector, private_key, records
        )
    except Duplicate as duplicate:
        raise conflict(duplicate.message) from None
    return DomainOut.of(domain)


@routes.route(
    "GET", "/domains", summary="List sending domains", permission="domains:read",
    query=Paging, response=DomainList,
)
async def list_domains(call: Call, query: Paging) -> dict[str, Any]:
    found = await store.list_domains(call.conn, call.team_id, query.limit + 1, query.offset)
    return page([DomainOut.of(domain) for domain in found], query.limit)


@routes.route(
    "GET", "/domains/{domain_id}", summary="Retrieve a sending domain",
    permission="domains:read", response=DomainOut,
)
async def get_domain(call: Call, domain_id: UUID) -> DomainOut:
    domain = await store.get_domain(call.conn, call.team_id, domain_id)
    if domain is None:
        raise not_found("domain")
    return DomainOut.of(domain)


# A verification waits on the domain's name servers, which its owner runs,
# with a pooled connection (and, under an Idempotency-Key, a transaction): a
# team has at most this many at once in a process, so that slow name servers
# of one team cannot take the connections every team's requests need.
VERIFICATIONS_PER_TEAM = 2
VERIFY_RETRY_AFTER_SECONDS = 1
_verifying: Counter[tuple[int, UUID]] = Counter()


@contextmanager
def _one_of_the_teams_verifications(call: Call) -> Iterator[None]:
    key = (id(call.service), call.team_id)
    if _verifying[key] >= VERIFICATIONS_PER_TEAM:
        raise ApiError(
            429, "TOO_MANY_REQUESTS",
            f"{VERIFICATIONS_PER_TEAM} verifications of this team's domains are running; "
            "retry once they are done",
            {"Retry-After": str(VERIFY_RETRY_AFTER_SECONDS)},
        )
    _verifying[key] += 1
    try:
        yield
    finally:
        _verifying[key] -= 1
        if not _verifying[key]:
            del _verifying[key]


@routes.route(
    "POST", "/domains/{domain_id}/verify",
    summary="Look the domain's records up now; verified when SPF and DKIM are",
    permission="domains:write", response=DomainOut, body_required=False, pooled=False,
)
async def verify_domain(call: Call, domain_id: UUID) -> Finish:
    # No connection is held while name servers are asked (``pooled=False``).
    domain = await call.service.db.run(store.get_domain, call.team_id, domain_id)
    if domain is None:
        raise not_found("domain")
    try:
        with _one_of_the_teams_verifications(call):
            statuses = await statuses_of(call.service.config, domain.records)
    except LookupFailed as error:
        raise ApiError(
            503, "SERVICE_UNAVAILABLE", f"DNS gave no answer, try again later: {error}"
        ) from None
    checked = outcome(domain, statuses)

    async def record(conn: Connection) -> DomainOut:
        stored = await store.record_checks(conn, [checked])
        if not stored:
            raise not_found("domain")  # deleted meanwhile
        return DomainOut.of(stored[0])

    return Finish(record)


@routes.route(
    "DELETE", "/domains/{domain_id}",
    summary="Delete a sending domain (a verified one needs a step-up token)",
    permission="domains:write", status=204,
)
async def delete_domain(call: Call, domain_id: UUID) -> Answer:
    deleted = await store.delete_domain(
        call.conn, call.team_id, domain_id, allow_verified=call.token.step_up
    )
    if deleted is None:
        raise not_found("domain")
    if deleted == "verified":
        raise ApiError(
            403, "STEP_UP_REQUIRED",
            "deleting a verified domain needs a step-up token (tidings tokens create --step-up)",
        )
    return Answer(204)
