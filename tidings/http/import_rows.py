"""The rows of a contact import: a JSON or CSV body read and checked row by row.

A row that cannot be stored is rejected on its own, with its number and the
reason; a body unfit as a whole is an ``ApiError``. Plain CPU work, run in a
worker thread by ``POST /contacts/import`` (``tidings.http.contact_import``).

CSV is read by ``csv_records``, which the command line (``tidings.importing``)
uses too: quoting as RFC 4180 has it, and a text whose quoting is broken is
refused whole, naming the line, never read by guessing where its rows end.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tidings.fields import NUL_REASON, FieldError, RepeatedKey, has_nul, strict_json
from tidings.http.contact_fields import (
    ConsentStatus,
    Email,
    boolean_from_text,
    check_properties,
    property_from_text,
)
from tidings.http.envelope import ApiError, bad_request, unprocessable
from tidings.phones import parse_phone
from tidings.storage import contact_import as store
from tidings.storage.contact_properties import PropertyType

MAX_ROWS = 50_000
CSV_TYPES = frozenset({"text/csv", "application/csv"})
DEFAULT_SOURCE = "import"

# csv caps a field at 131,072 characters by default, a guard for readers of
# unbounded streams; past it, the whole text fails. Every CSV text read here
# is whole in memory already, bounded by TIDINGS_IMPORT_MAX_BODY_BYTES (the
# command line: by the file it read), so the cap guards nothing, and a cell
# too long for its field is that row's rejection (255 characters for a name,
# 2000 for a string property), not the body's. The cap is process-wide: it is
# lifted once, here, to the most a C long holds on every platform; Tidings
# reads CSV nowhere else.
csv.field_size_limit(2**31 - 1)


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


FIELDS = tuple(ImportContact.model_fields)
TEXT_FIELDS = frozenset(FIELDS) - {"unsubscribed", "properties"}


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
            email = values.get("email")
            self.reject(row, None if has_nul(email) else email, f"row: {NUL_REASON}")
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
        if contact.sms_consent_source is not None and consent in (None, "unknown"):
            # As POST /contacts: the source describes a change of status.
            self.reject(row, contact.email, "sms_consent_source: is only accepted with an "
                        "sms_consent_status other than unknown")
            return
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
        document = strict_json(data)
    except RepeatedKey as error:
        raise bad_request(f"invalid body: {error}") from None
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


class MalformedCsv(ValueError):
    """A CSV text whose quoting is broken; ``line`` (1: the first) is where."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}")
        self.line = line


UNCLOSED = (
    'a quoted field in the row that starts here is never closed (a " is missing), '
    "so the rest of the text{to_last} would be one cell"
)
MISPLACED = (
    'a quoted field goes on after its closing " ({error}); a " inside a quoted '
    'field is written twice (""), and the field ends at the quote that closes it'
)


def csv_records(text: str) -> list[list[str]]:
    """The records of a CSV text, blank lines left out, read strictly.

    A field that starts with ``"`` is quoted as RFC 4180 has it: it must be
    closed, and nothing but a comma or the end of the line may follow its
    closing quote. Otherwise the reader could only guess where rows end (an
    unclosed quote would take every line after it into one cell), so
    MalformedCsv names the line instead. A ``"`` inside a field that does not
    start with one is taken as it is (``O"Brien``): where rows end is not in
    doubt there.
    """
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    records: list[list[str]] = []
    while True:
        start = reader.line_num + 1
        try:
            record = next(reader)
        except StopIteration:
            return records
        except csv.Error as error:
            if str(error) == "unexpected end of data":
                last = reader.line_num
                to_last = f", to line {last}," if last > start else ""
                raise MalformedCsv(start, UNCLOSED.format(to_last=to_last)) from None
            if "expected after" in str(error):
                raise MalformedCsv(reader.line_num, MISPLACED.format(error=error)) from None
            raise MalformedCsv(reader.line_num, str(error)) from None
        if record:
            records.append(record)


def parse_csv(data: bytes, known: Mapping[str, PropertyType]) -> Parsed:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise bad_request(f"CSV body: not UTF-8 (byte {error.start})") from None
    if "\x00" in text:
        raise bad_request(f"CSV body: {NUL_REASON}")
    try:
        records = csv_records(text)
    except MalformedCsv as error:
        raise bad_request(f"CSV body: {error}; nothing was imported") from None
    if not records:
        raise bad_request("CSV body: empty; send a header row and one row per contact")
    columns = _header(records[0], known)
    rows = records[1:]
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


def parse_body(data: bytes, content_type: str, known: Mapping[str, PropertyType]) -> Parsed:
    """The rows of a request body, checked; ApiError for a body unfit as a whole."""
    if content_type in CSV_TYPES:
        return parse_csv(data, known)
    if content_type in ("", "application/json"):
        if not data.strip():
            raise bad_request("request body is required: a JSON array of contacts, or a CSV text")
        return parse_json(data, known)
    raise bad_request(
        f"Content-Type: {content_type!r} is not importable; send application/json or text/csv"
    )
