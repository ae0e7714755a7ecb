"""Bulk import of contacts: ``POST /contacts/import``.

The body is a JSON array of contacts, a JSON object ``{"contacts": [...],
"segment_id": ...}``, or (``Content-Type: text/csv``) a CSV text with a
header row. Rows are upserted by email, case-insensitively; a row that
cannot be stored is rejected on its own, with its number and the reason,
and the others go in. Everything that goes in goes in one transaction, in
one set-based statement.

Checking rows is CPU work (about 10 µs a row) and runs in a worker thread,
so the other requests of the process keep being served meanwhile.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from uuid import UUID

import trio
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tidings.fields import NUL_REASON, FieldError, has_nul
from tidings.http.contact_fields import (
    ConsentStatus,
    Email,
    boolean_from_text,
    check_properties,
    property_from_text,
)
from tidings.http.envelope import ApiError, bad_request, not_found, unprocessable
from tidings.http.routing import Call, RawBody, Routes
from tidings.phones import parse_phone
from tidings.storage import contact_properties as definitions
from tidings.storage import contacts as store
from tidings.storage import segments as segment_store
from tidings.storage.contact_properties import PropertyType

routes = Routes("Contacts")

MAX_ROWS = 50_000
# The response lists this many rejected rows at most; rejected_count has them all.
MAX_LISTED_REJECTIONS = 1000
CSV_TYPES = frozenset({"text/csv", "application/csv"})
DEFAULT_SOURCE = "import"


class ImportQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    segment_id: UUID | None = Field(None, description="Add every imported contact to it")


class ImportContact(BaseModel):
    """One row. Absent (or null, or an empty CSV cell) leaves a stored value as it is.

    Strict like a RequestBody; NUL characters are looked for once per body
    (rows are checked one by one only in a JSON body that has an escaped NUL).
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    email: Email
    phone: str | None = Field(None, min_length=1, max_length=32)
    first_name: str | None = Field(None, max_length=255)
    last_name: str | None = Field(None, max_length=255)
    unsubscribed: bool | None = None
    sms_consent_status: ConsentStatus | None = Field(
        None, description="unknown changes nothing: an import cannot erase a recorded choice"
    )
    sms_consent_source: str | None = Field(None, min_length=1, max_length=50)
    properties: dict[str, Any] | None = None


class Rejection(BaseModel):
    row: int = Field(description="1 is the first contact (in CSV, the line after the header)")
    email: str | None
    reason: str


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


FIELDS = tuple(ImportContact.model_fields)
TEXT_FIELDS = frozenset(FIELDS) - {"unsubscribed", "properties"}

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


@dataclass
class Parsed:
    """What the checks made of a body: rows to store, and rows refused."""

    total: int
    rows: list[store.ImportRow]
    rejected: list[Rejection]
    segment_id: UUID | None = None


def _reason(error: ValidationError) -> str:
    parts = []
    for detail in error.errors(include_url=False)[:3]:
        location = ".".join(str(part) for part in detail["loc"]) or "row"
        message = "is required" if detail["type"] == "missing" else detail["msg"]
        if detail["type"] == "extra_forbidden":
            message = "is not a known field"
        parts.append(f"{location}: {message}")
    return "; ".join(parts)


class Checker:
    """Checks rows one by one against the team's property definitions."""

    def __init__(self, known: Mapping[str, PropertyType], check_nul: bool = False) -> None:
        self.known = known
        self.check_nul = check_nul
        self.rows: list[store.ImportRow] = []
        self.rejected: list[Rejection] = []

    def reject(self, row: int, email: Any, reason: str) -> None:
        self.rejected.append(Rejection(row=row, email=email if isinstance(email, str) else None,
                                       reason=reason))

    def add(self, row: int, values: Any) -> None:
        if not isinstance(values, dict):
            self.reject(row, None, "row: must be a JSON object")
            return
        if self.check_nul and has_nul(values):
            self.reject(row, None, f"row: {NUL_REASON}")
            return
        try:
            contact = ImportContact.model_validate(values)
        except ValidationError as error:
            self.reject(row, values.get("email"), _reason(error))
            return
        try:
            phone = parse_phone(contact.phone) if contact.phone else None
            to_set, _ = check_properties(contact.properties or {}, self.known)
        except FieldError as error:
            self.reject(row, contact.email, str(error))
            return
        consent = contact.sms_consent_status
        self.rows.append(
            store.ImportRow(
                row=row,
                email=contact.email,
                phone=contact.phone,
                normalized_phone=None if phone is None else phone.e164,
                phone_country=None if phone is None else phone.country,
                first_name=contact.first_name,
                last_name=contact.last_name,
                unsubscribed=contact.unsubscribed,
                sms_consent_status=None if consent == "unknown" else consent,
                sms_consent_source=contact.sms_consent_source or DEFAULT_SOURCE,
                properties=json.dumps(to_set) if to_set else None,
            )
        )


def too_many(count: int) -> ApiError:
    return ApiError(
        413, "PAYLOAD_TOO_LARGE",
        f"an import takes at most {MAX_ROWS} rows; this one has {count}: split it",
    )


def parse_json(data: bytes, known: Mapping[str, PropertyType]) -> Parsed:
    try:
        document = json.loads(data)
    except (ValueError, RecursionError):
        raise bad_request("request body is not valid JSON") from None
    segment_id = None
    if isinstance(document, dict):
        extra = sorted(set(document) - {"contacts", "segment_id"})
        if extra:
            raise bad_request(f"invalid body: {extra[0]}: is not a known field")
        if "contacts" not in document:
            raise bad_request("invalid body: contacts: is required")
        raw_segment = document.get("segment_id")
        if raw_segment is not None:
            try:
                segment_id = UUID(raw_segment) if isinstance(raw_segment, str) else None
            except ValueError:
                segment_id = None
            if segment_id is None:
                raise bad_request(f"invalid body: segment_id: {raw_segment!r} is not a valid UUID")
        document = document["contacts"]
    if not isinstance(document, list):
        raise bad_request(
            "invalid body: send a JSON array of contacts, or an object with a contacts array"
        )
    if len(document) > MAX_ROWS:
        raise too_many(len(document))
    # JSON can only write a NUL as an escape; without one, no row has any.
    checker = Checker(known, check_nul=b"\\u0000" in data)
    for number, values in enumerate(document, start=1):
        checker.add(number, values)
    return Parsed(len(document), checker.rows, checker.rejected, segment_id)


def _header(names: list[str], known: Mapping[str, PropertyType]) -> list[tuple[str, str]]:
    """Each column as (``field`` or ``property``, name)."""
    columns: list[tuple[str, str]] = []
    seen: set[str] = set()
    unknown: list[str] = []
    for raw in names:
        name = raw.strip()
        if not name:
            raise bad_request("CSV header: a column has no name")
        field = name.lower()
        if field in FIELDS and field != "properties":
            column = ("field", field)
        elif name in known:
            column = ("property", name)
        else:
            unknown.append(name)
            continue
        if column[1] in seen:
            raise bad_request(f"CSV header: column {name!r} appears twice")
        seen.add(column[1])
        columns.append(column)
    if unknown:
        raise unprocessable(
            f"CSV header: {', '.join(repr(name) for name in unknown)}: neither a contact field "
            "nor a defined contact property (POST /contact-properties)"
        )
    if ("field", "email") not in columns:
        raise bad_request("CSV header: an email column is required")
    return columns


def _csv_values(
    cells: list[str], columns: list[tuple[str, str]], known: Mapping[str, PropertyType]
) -> dict[str, Any]:
    values: dict[str, Any] = {}
    properties: dict[str, Any] = {}
    for (kind, name), cell in zip(columns, cells, strict=True):
        if cell == "":
            continue  # an empty cell gives no value
        if kind == "property":
            properties[name] = property_from_text(known[name], cell, f"properties.{name}")
        elif name == "unsubscribed":
            values[name] = boolean_from_text(cell, name)
        else:
            values[name] = cell
    if properties:
        values["properties"] = properties
    return values


def parse_csv(data: bytes, known: Mapping[str, PropertyType]) -> Parsed:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise bad_request(f"CSV body: not UTF-8 (byte {error.start})") from None
    if "\x00" in text:
        raise bad_request(f"CSV body: {NUL_REASON}")
    records = (record for record in csv.reader(io.StringIO(text, newline="")) if record)
    try:
        header = next(records, None)
        if header is None:
            raise bad_request("CSV body: empty; send a header row and one row per contact")
        columns = _header(header, known)
        rows = list(records)
    except csv.Error as error:
        raise bad_request(f"CSV body: {error}") from None
    if len(rows) > MAX_ROWS:
        raise too_many(len(rows))
    checker = Checker(known)
    email_at = [name for _, name in columns].index("email")
    for number, cells in enumerate(rows, start=1):
        if len(cells) != len(columns):
            email = cells[email_at] if email_at < len(cells) else None
            checker.reject(
                number, email, f"row: has {len(cells)} fields, the header has {len(columns)}"
            )
            continue
        try:
            values = _csv_values(cells, columns, known)
        except FieldError as error:
            checker.reject(number, cells[email_at] or None, str(error))
            continue
        checker.add(number, values)
    return Parsed(len(rows), checker.rows, checker.rejected)


def parse_body(body: RawBody, known: Mapping[str, PropertyType]) -> Parsed:
    """The rows of a request body, checked; ApiError for a body unfit as a whole."""
    if body.content_type in CSV_TYPES:
        return parse_csv(body.data, known)
    if body.content_type in ("", "application/json"):
        if not body.data.strip():
            raise bad_request("request body is required: a JSON array of contacts, or a CSV text")
        return parse_json(body.data, known)
    raise bad_request(
        f"Content-Type: {body.content_type!r} is not importable; "
        "send application/json or text/csv"
    )


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
    parsed = await trio.to_thread.run_sync(parse_body, raw_body, known)
    if query.segment_id and parsed.segment_id and query.segment_id != parsed.segment_id:
        raise bad_request("segment_id: the query and the body name different segments")
    segment_id = query.segment_id or parsed.segment_id
    await drop_repeats(call, parsed)
    async with call.conn.transaction():
        if segment_id is not None and not await segment_store.lock_segment(
            call.conn, call.team_id, segment_id
        ):
            raise not_found("segment")
        result = await store.import_contacts(call.conn, call.team_id, parsed.rows, segment_id)
    rejected = parsed.rejected
    if result.contended:
        emails = {row.row: row.email for row in parsed.rows}
        rejected = rejected + [
            Rejection(row=row, email=emails[row],
                      reason="email: changed by another request meanwhile; import it again")
            for row in result.contended
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
