"""Bulk import of contacts: ``POST /contacts/import``.

The body is a JSON array of contacts, a JSON object ``{"contacts": [...],
"segment_id": ...}``, or (``Content-Type: text/csv``) a CSV text with a
header row. Rows are upserted by email, case-insensitively; a row that
cannot be stored is rejected on its own, with its number and the reason,
and the others go in. Everything that goes in goes in one transaction, in
one set-based statement.

Checking rows (``tidings.http.import_rows``) is CPU work (about 10 µs a
row) and runs in a worker thread, so the other requests of the process keep
being served meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal
from uuid import UUID

import asyncpg
import trio
from pydantic import BaseModel, ConfigDict, Field

from tidings.http.contacts import stop_reason
from tidings.http.envelope import bad_request, not_found
from tidings.http.import_rows import MAX_ROWS, ImportContact, Parsed, Rejection, parse_body
from tidings.http.parsing import QueryId
from tidings.http.routing import Call, RawBody, Routes
from tidings.storage import contact_import as store
from tidings.storage import contact_properties as definitions
from tidings.storage import segments as segment_store

__all__ = ["MAX_LISTED_REJECTIONS", "MAX_ROWS", "routes"]

routes = Routes("Contacts")

# The response lists this many rejected rows at most; rejected_count has them all.
MAX_LISTED_REJECTIONS = 1000
# Runs of an import that PostgreSQL ends to break a deadlock, before it fails.
DEADLOCK_ATTEMPTS = 3


class ImportQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    segment_id: QueryId | None = Field(None, description="Add every imported contact to it")


class ImportOut(BaseModel):
    object: Literal["contact_import"] = "contact_import"
    rows: int = Field(description="Rows received")
    created: int
    updated: int
    rejected_count: int
    rejected: list[Rejection] = Field(
        description=f"The rejected rows, at most the first {MAX_LISTED_REJECTIONS}"
    )
    segment_id: UUID | None
    added_to_segment: int = Field(description="Contacts that were not in the segment before")


_IMPORT_SCHEMA = ImportContact.model_json_schema()
_ROWS_SCHEMA = {"type": "array", "maxItems": MAX_ROWS, "items": _IMPORT_SCHEMA}
REQUEST_CONTENT: dict[str, Any] = {
    "application/json": {
        "schema": {
            "oneOf": [
                _ROWS_SCHEMA,
                {
                    "type": "object",
                    "required": ["contacts"],
                    "additionalProperties": False,
                    "properties": {
                        "contacts": _ROWS_SCHEMA,
                        "segment_id": {"type": "string", "format": "uuid"},
                    },
                },
            ]
        }
    },
    "text/csv": {
        "schema": {
            "type": "string",
            "description": (
                "A header row naming the columns: email (required), phone, first_name, "
                "last_name, unsubscribed (true/false), sms_consent_status, "
                "sms_consent_source, and the keys of the team's contact properties"
            ),
        }
    },
}


async def drop_repeats(call: Call, parsed: Parsed) -> None:
    """Reject each row whose email an earlier row has: the first one wins.

    Emails are compared as PostgreSQL folds their case, as the unique index
    does; Python's ``str.lower`` folds some letters otherwise (U+0130).
    """
    keys = await store.email_keys(call.conn, [row.email for row in parsed.rows])
    first_row_of: dict[str, int] = {}
    kept: list[store.ImportRow] = []
    for row, key in zip(parsed.rows, keys, strict=True):
        earlier = first_row_of.setdefault(key, row.row)
        if earlier == row.row:
            kept.append(row)
        else:
            parsed.rejected.append(Rejection(
                row=row.row, email=row.email, reason=f"email: repeats row {earlier} of this import"
            ))
    parsed.rows = kept


def listed(rejected: Iterable[Rejection]) -> list[Rejection]:
    ordered = sorted(rejected, key=lambda rejection: rejection.row)
    return ordered[:MAX_LISTED_REJECTIONS]


@routes.route(
    "POST", "/contacts/import",
    summary=f"Import up to {MAX_ROWS} contacts (JSON or CSV), upserted by email",
    permission="contacts:write", query=ImportQuery, response=ImportOut,
    raw_body=REQUEST_CONTENT, body_limit=lambda config: config.import_max_body_bytes,
)
async def import_contacts(call: Call, query: ImportQuery, raw_body: RawBody) -> ImportOut:
    known = await definitions.property_types(call.conn, call.team_id)
    parsed = await trio.to_thread.run_sync(
        parse_body, raw_body.data, raw_body.content_type, known
    )
    if query.segment_id and parsed.segment_id and query.segment_id != parsed.segment_id:
        raise bad_request("segment_id: the query and the body name different segments")
    segment_id = query.segment_id or parsed.segment_id
    await drop_repeats(call, parsed)
    # The import locks in one order (docs/audience.md), so it does not
    # deadlock with another import or a property's deletion; a cycle that
    # takes a third writer is still possible, and PostgreSQL then ends one
    # of them. The import is rolled back whole and run again.
    for attempt in range(1, DEADLOCK_ATTEMPTS + 1):
        try:
            async with call.conn.transaction():
                if segment_id is not None and not await segment_store.lock_segment(
                    call.conn, call.team_id, segment_id
                ):
                    raise not_found("segment")
                result = await store.import_contacts(
                    call.conn, call.team_id, parsed.rows, segment_id, known
                )
            break
        except asyncpg.DeadlockDetectedError:
            if attempt == DEADLOCK_ATTEMPTS:
                raise
    rejected = parsed.rejected
    if result.contended or result.gone or result.stopped:
        emails = {row.row: row.email for row in parsed.rows}
        rejected = rejected + [
            Rejection(row=row, email=emails[row],
                      reason="email: changed by another request meanwhile; import it again")
            for row in result.contended
        ] + [
            Rejection(row=row, email=emails[row],
                      reason=f"properties.{key}: its definition was deleted meanwhile")
            for row, key in result.gone.items()
        ] + [
            Rejection(row=row, email=emails[row], reason=stop_reason(at))
            for row, at in result.stopped.items()
        ]
    return ImportOut(
        rows=parsed.total,
        created=result.created,
        updated=result.updated,
        rejected_count=len(rejected),
        rejected=listed(rejected),
        segment_id=segment_id,
        added_to_segment=result.added_to_segment,
    )
