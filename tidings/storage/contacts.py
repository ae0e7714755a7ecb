"""Contacts of a team."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg

from tidings.storage.errors import Duplicate

CONTACT_COLUMNS = """
id, team_id, email, phone, normalized_phone, phone_country, sms_consent_status,
sms_consent_updated_at, sms_consent_source, first_name, last_name, unsubscribed,
properties, created_at, updated_at
"""

INSERT_CONTACT = f"""
INSERT INTO contacts (team_id, email, phone, normalized_phone, phone_country,
                      sms_consent_status, sms_consent_updated_at, sms_consent_source,
                      first_name, last_name, unsubscribed, properties)
VALUES ($1, $2, $3, $4, $5, $6,
        CASE WHEN $6 = 'unknown' THEN NULL ELSE now() END,
        CASE WHEN $6 = 'unknown' THEN NULL ELSE $7 END,
        $8, $9, $10, $11::jsonb)
RETURNING {CONTACT_COLUMNS}
"""

SELECT_CONTACT = f"SELECT {CONTACT_COLUMNS} FROM contacts WHERE team_id = $1 AND id = $2"


@dataclass(frozen=True)
class Contact:
    id: UUID
    team_id: UUID
    email: str | None
    phone: str | None
    normalized_phone: str | None
    phone_country: str | None
    sms_consent_status: str
    sms_consent_updated_at: datetime | None
    sms_consent_source: str | None
    first_name: str | None
    last_name: str | None
    unsubscribed: bool
    properties: dict[str, Any]
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: Any) -> Contact:
        fields = dict(row)
        fields["properties"] = json.loads(fields["properties"])
        return cls(**fields)


@dataclass(frozen=True)
class NewContact:
    email: str | None
    phone: str | None
    normalized_phone: str | None
    phone_country: str | None
    sms_consent_status: str
    sms_consent_source: str
    first_name: str | None
    last_name: str | None
    unsubscribed: bool
    properties: dict[str, Any]


async def create_contact(conn: Any, team_id: UUID, new: NewContact) -> Contact:
    """Insert a contact. Raises Duplicate if the team has one with this email."""
    try:
        row = await conn.fetchrow(
            INSERT_CONTACT,
            team_id,
            new.email,
            new.phone,
            new.normalized_phone,
            new.phone_country,
            new.sms_consent_status,
            new.sms_consent_source,
            new.first_name,
            new.last_name,
            new.unsubscribed,
            json.dumps(new.properties),
        )
    except asyncpg.UniqueViolationError:
        raise Duplicate("email", f"a contact with email {new.email!r} exists already") from None
    return Contact.from_row(row)


async def get_contact(conn: Any, team_id: UUID, contact_id: UUID) -> Contact | None:
    row = await conn.fetchrow(SELECT_CONTACT, team_id, contact_id)
    return None if row is None else Contact.from_row(row)
