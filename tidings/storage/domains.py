"""Sending domains of a team: their DKIM keys and records, and what the last
DNS check found.

The private key leaves this module only in a ``SendingDomain``, for signing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

import asyncpg

from tidings.email.names import domain_name
from tidings.email.records import Record, return_path_host
from tidings.storage.connection import Connection
from tidings.storage.errors import Duplicate

DomainStatus = Literal["pending", "verified", "failed"]

COLUMNS = (
    "id, team_id, name, status, dkim_selector, records, created_at, updated_at, "
    "verified_at, last_checked_at"
)

INSERT_DOMAIN = f"""
INSERT INTO domains (team_id, name, dkim_selector, dkim_private_key, records)
VALUES ($1, $2, $3, $4, $5::jsonb)
RETURNING {COLUMNS}
"""

SELECT_DOMAIN = f"SELECT {COLUMNS} FROM domains WHERE team_id = $1 AND id = $2"

SELECT_DOMAINS = f"""
SELECT {COLUMNS} FROM domains
WHERE team_id = $1
ORDER BY created_at DESC, id DESC
LIMIT $2 OFFSET $3
"""

# A verified domain goes only when $3 (the caller holds a step-up token).
DELETE_DOMAIN = """
WITH target AS (
    SELECT id, status FROM domains WHERE team_id = $1 AND id = $2 FOR UPDATE
), deleted AS (
    DELETE FROM domains d USING target
    WHERE d.id = target.id AND (target.status <> 'verified' OR $3)
    RETURNING d.id
)
SELECT target.status, EXISTS (SELECT 1 FROM deleted) AS deleted FROM target
"""

# One statement for any number of checked domains: $1 ids, $2 records (JSON
# text), $3 statuses. verified_at moves only when a domain becomes verified.
RECORD_CHECKS = f"""
UPDATE domains d SET
    records = c.records::jsonb,
    status = c.status,
    verified_at = CASE WHEN c.status = 'verified' AND d.status <> 'verified' THEN now()
                       ELSE d.verified_at END,
    last_checked_at = now(),
    updated_at = CASE WHEN c.status <> d.status OR c.records::jsonb <> d.records THEN now()
                      ELSE d.updated_at END
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::boolean[], $5::timestamptz[])
    AS c(id, records, status, guarded, checked_at)
WHERE d.id = c.id AND (NOT c.guarded OR d.last_checked_at IS NOT DISTINCT FROM c.checked_at)
RETURNING {", ".join("d." + column.strip() for column in COLUMNS.split(","))}
"""

# Verified domains not checked for $1 seconds, oldest check first.
SELECT_DUE = f"""
SELECT {COLUMNS} FROM domains
WHERE status = 'verified'
  AND (last_checked_at IS NULL OR last_checked_at < now() - make_interval(secs => $1))
ORDER BY last_checked_at NULLS FIRST
LIMIT $2
"""

SELECT_SENDING = """
SELECT name, dkim_selector, dkim_private_key FROM domains
WHERE team_id = $1 AND name = $2 AND status = 'verified'
"""

SELECT_VERIFIED_IDS = """
SELECT name, id FROM domains WHERE team_id = $1 AND name = ANY($2::text[]) AND status = 'verified'
"""

SELECT_KEY = "SELECT name, dkim_selector, dkim_private_key FROM domains WHERE id = $1"


@dataclass(frozen=True)
class Domain:
    id: UUID
    team_id: UUID
    name: str
    status: DomainStatus
    dkim_selector: str
    records: list[Record]
    created_at: datetime
    updated_at: datetime
    verified_at: datetime | None
    last_checked_at: datetime | None


@dataclass(frozen=True)
class SendingDomain:
    """What signing and the envelope need of a verified domain."""

    name: str
    dkim_selector: str
    dkim_private_key: bytes  # PKCS#1 PEM
    return_path: str  # the return-path host: MAIL FROM addresses are on it


def _domain(row: Any) -> Domain:
    fields = dict(row)
    fields["records"] = [Record.from_json(item) for item in json.loads(fields["records"])]
    return Domain(**fields)


def _records_json(records: Sequence[Record]) -> str:
    return json.dumps([record.to_json() for record in records])


async def create_domain(
    conn: Connection,
    team_id: UUID,
    name: str,
    selector: str,
    private_key: bytes,
    records: Sequence[Record],
) -> Domain:
    """Raises Duplicate when the team has a domain of that name."""
    try:
        row = await conn.fetchrow(
            INSERT_DOMAIN, team_id, name, selector, private_key.decode("ascii"),
            _records_json(records),
        )
    except asyncpg.UniqueViolationError:
        raise Duplicate("name", f"name: the team already has the domain {name}") from None
    return _domain(row)


async def get_domain(conn: Connection, team_id: UUID, domain_id: UUID) -> Domain | None:
    row = await conn.fetchrow(SELECT_DOMAIN, team_id, domain_id)
    return None if row is None else _domain(row)


async def list_domains(conn: Connection, team_id: UUID, limit: int, offset: int) -> list[Domain]:
    return [_domain(row) for row in await conn.fetch(SELECT_DOMAINS, team_id, limit, offset)]


async def delete_domain(
    conn: Connection, team_id: UUID, domain_id: UUID, *, allow_verified: bool
) -> Literal["deleted", "verified"] | None:
    """Delete the domain: ``deleted``; None when the team has no such domain;
    ``verified`` (nothing deleted) when it is verified and not ``allow_verified``."""
    row = await conn.fetchrow(DELETE_DOMAIN, team_id, domain_id, allow_verified)
    if row is None:
        return None
    return "deleted" if row["deleted"] else "verified"


@dataclass(frozen=True)
class Check:
    """The outcome of looking up one domain's records."""

    domain_id: UUID
    records: list[Record]
    status: Literal["verified", "failed"]
    # Stored only if the domain was not checked since ``checked_at`` (its
    # ``last_checked_at`` when read): a periodic check never overwrites a
    # newer one (a verify asked for meanwhile, another process's check).
    guarded: bool = False
    checked_at: datetime | None = None


async def record_checks(conn: Connection, checks: Sequence[Check]) -> list[Domain]:
    """Store what checks found, for any number of domains in one statement; the
    domains as they are now (a domain deleted meanwhile is left out, and so
    is one a guarded check found checked since)."""
    rows = await conn.fetch(
        RECORD_CHECKS,
        [check.domain_id for check in checks],
        [_records_json(check.records) for check in checks],
        [check.status for check in checks],
        [check.guarded for check in checks],
        [check.checked_at for check in checks],
    )
    return [_domain(row) for row in rows]


async def due_for_recheck(conn: Connection, interval_seconds: float, limit: int) -> list[Domain]:
    """Verified domains, of every team, last checked more than ``interval_seconds`` ago."""
    return [_domain(row) for row in await conn.fetch(SELECT_DUE, interval_seconds, limit)]


async def sending_domain(
    conn: Connection, team_id: UUID, domain_name_: str
) -> SendingDomain | None:
    """The team's verified domain ``domain_name_`` (any case; IDNs in either
    form), with its key; None when the team has no such verified domain."""
    try:
        name = domain_name(domain_name_)
    except ValueError:
        return None
    return _sending(await conn.fetchrow(SELECT_SENDING, team_id, name))


async def verified_domain_ids(
    conn: Connection, team_id: UUID, names: Iterable[str]
) -> dict[str, UUID]:
    """Of the domain names ``names`` (as emails carry them), those that are a
    verified domain of the team now, each with that domain's id."""
    keys: dict[str, str] = {}
    for given in names:
        with suppress(ValueError):
            keys[given] = domain_name(given)
    rows = await conn.fetch(SELECT_VERIFIED_IDS, team_id, sorted(set(keys.values())))
    ids = {row["name"]: row["id"] for row in rows}
    return {given: ids[name] for given, name in keys.items() if name in ids}


async def domain_key(conn: Connection, domain_id: UUID) -> SendingDomain | None:
    """The name and DKIM key of the domain ``domain_id`` (they never change), in
    whatever state; None when it is gone."""
    return _sending(await conn.fetchrow(SELECT_KEY, domain_id))


def _sending(row: Any) -> SendingDomain | None:
    if row is None:
        return None
    return SendingDomain(
        name=row["name"],
        dkim_selector=row["dkim_selector"],
        dkim_private_key=row["dkim_private_key"].encode("ascii"),
        return_path=return_path_host(row["name"]),
    )
