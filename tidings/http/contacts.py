"""Contacts over HTTP: create, list with filters, get, update and delete.

A single contact is named in the path by its id or by its email address
(``GET /contacts/ada@example.com``), case-insensitively; the email, there and
in the ``email`` filter, is normalised as a contact's email is when stored.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Self
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tidings.addresses import MAX_ADDRESS_LENGTH, lookup_address
from tidings.fields import FieldError, has_nul
from tidings.http.contact_fields import ConsentStatus, Email, check_properties
from tidings.http.envelope import (
    ApiError,
    bad_request,
    conflict,
    not_found,
    rfc3339,
    unprocessable,
)
from tidings.http.models import NOT_EMPTY, UNCHANGED, ListQuery, RequestBody, never_null
from tidings.http.paging import page
from tidings.http.parsing import QueryId, path_uuid
from tidings.http.routing import Answer, Call, Routes
from tidings.phones import parse_phone
from tidings.storage import contact_properties as definitions
from tidings.storage import contacts as store
from tidings.storage import segments as segment_store
from tidings.storage.contact_properties import PropertyType

routes = Routes("Contacts", storage_units=True)

CONTACT_REF: dict[str, type] = {"contact_id": str}
SOURCE = "Where a change of sms_consent_status came from: api, import, keyword, ..."


class CreateContact(RequestBody):
    email: Email | None = None
    phone: str | None = Field(
        None, min_length=1, max_length=32, description="International format, e.g. +14155550100"
    )
    first_name: str | None = Field(None, max_length=255)
    last_name: str | None = Field(None, max_length=255)
    unsubscribed: bool = False
    sms_consent_status: ConsentStatus = "unknown"
    sms_consent_source: str | None = Field(
        None, min_length=1, max_length=50, json_schema_extra=never_null,
        description=SOURCE + " (only with an sms_consent_status other than unknown; default api)",
    )
    properties: dict[str, Any] = Field(
        default_factory=dict,
        description="Values of the team's contact properties (POST /contact-properties)",
    )

    @model_validator(mode="after")
    def reachable(self) -> Self:
        if self.email is None and self.phone is None:
            raise ValueError("a contact needs an email or a phone")
        if "sms_consent_source" in self.model_fields_set and self.sms_consent_source is None:
            raise ValueError("sms_consent_source: must not be null")
        # The source describes a change of status; "unknown" records none.
        if "sms_consent_source" in self.model_fields_set and self.sms_consent_status == "unknown":
            raise ValueError(
                "sms_consent_source: is only accepted with an sms_consent_status "
                "other than unknown"
            )
        return self


# PATCH fields that may not be set to null.
NOT_NULLABLE = ("unsubscribed", "sms_consent_status", "sms_consent_source", "properties")


class UpdateContact(RequestBody):
    """Only the fields given change; ``null`` clears email, phone and names.
    ``properties`` are merged key by key, a null value removing its key."""

    model_config = NOT_EMPTY

    email: Email | None = None
    phone: str | None = Field(None, min_length=1, max_length=32)
    first_name: str | None = Field(None, max_length=255)
    last_name: str | None = Field(None, max_length=255)
    unsubscribed: bool | None = UNCHANGED
    sms_consent_status: ConsentStatus | None = UNCHANGED
    sms_consent_source: str | None = Field(
        None, min_length=1, max_length=50, description=SOURCE + " (default api)",
        json_schema_extra=never_null,
    )
    properties: dict[str, Any] | None = UNCHANGED

    @model_validator(mode="after")
    def meaningful(self) -> Self:
        if not self.model_fields_set:
            raise ValueError("give at least one field to change")
        for name in NOT_NULLABLE:
            if name in self.model_fields_set and getattr(self, name) is None:
                raise ValueError(f"{name}: must not be null")
        if "sms_consent_source" in self.model_fields_set and self.sms_consent_status is None:
            raise ValueError("sms_consent_source: is only accepted with sms_consent_status")
        return self


class ContactOut(BaseModel):
    """A contact. Every field is present; those without a value are null."""

    model_config = ConfigDict(from_attributes=True)

    object: Literal["contact"] = "contact"
    id: UUID
    team_id: UUID
    email: str | None
    phone: str | None
    normalized_phone: str | None = Field(description="E.164")
    phone_country: str | None = Field(description="ISO 3166-1 alpha-2 region of the phone")
    sms_consent_status: ConsentStatus
    sms_consent_updated_at: datetime | None = Field(
        description="When sms_consent_status last changed"
    )
    sms_consent_source: str | None = Field(description="Where that change came from")
    first_name: str | None
    last_name: str | None
    unsubscribed: bool
    properties: dict[str, Any]
    created_at: datetime
    updated_at: datetime


class ContactList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ContactOut]
    has_more: bool


class ContactQuery(ListQuery):
    email: str | None = Field(None, min_length=1, description="Exact, case-insensitive")
    segment_id: QueryId | None = Field(None, description="Members of this segment only")
    unsubscribed: bool | None = None
    search: str | None = Field(
        None, min_length=1, max_length=200,
        description="Case-insensitive partial match on email, first and last name",
    )

    @field_validator("email", mode="after")
    @classmethod
    def _lookup_address(cls, value: str | None) -> str | None:
        return None if value is None else lookup_address(value)


def contact_ref(raw: str) -> store.ContactRef:
    """A contact id, or an email address (normalised by ``lookup_address``,
    matched case-insensitively)."""
    if (found := path_uuid(raw)) is not None:
        return found
    if "@" in raw and not has_nul(raw) and len(raw) <= MAX_ADDRESS_LENGTH:
        return lookup_address(raw)
    raise bad_request(f"contact_id: {raw!r} is neither a contact id (UUID) nor an email address")


async def find_contact_id(call: Call, raw: str) -> UUID:
    """The id of the team's contact named in a path by its id or email; 400
    for a value that is neither, 404 for no such contact."""
    found = await store.find_contact_id(call.conn, call.team_id, contact_ref(raw))
    if found is None:
        raise not_found("contact")
    return found


def phone_fields(phone: str | None) -> tuple[str | None, str | None]:
    """``normalized_phone`` and ``phone_country`` of ``phone``, or 400 naming it."""
    if phone is None:
        return None, None
    try:
        parsed = parse_phone(phone)
    except FieldError as error:
        raise bad_request(str(error)) from None
    return parsed.e164, parsed.country


async def checked_properties(
    call: Call, values: dict[str, Any]
) -> tuple[dict[str, Any], list[str], dict[str, PropertyType]]:
    """Properties to set, keys to remove, and the type each key to set was
    checked as; 422 naming an unknown key or a wrong type.

    The write then holds those definitions (``tidings.storage.contacts``):
    one deleted meanwhile is ``store.PropertyGone``, see ``gone``."""
    if not values:
        return {}, [], {}
    known = await definitions.property_types(call.conn, call.team_id)
    try:
        to_set, removed = check_properties(values, known)
    except FieldError as error:
        raise unprocessable(str(error)) from None
    return to_set, removed, {key: known[key] for key in to_set}


def gone(error: store.PropertyGone) -> ApiError:
    """422 for a write that met the deletion of a definition it checked against."""
    field = f"properties.{error.key}"
    return unprocessable(str(FieldError(field, "its definition was deleted meanwhile")))


def stop_reason(at: datetime) -> str:
    """Why a number whose STOP stands cannot be ``opted_in`` (``docs/sms.md``, Consent)."""
    return (f"sms_consent_status: the number replied STOP ({rfc3339(at)}); "
            "it is opted in again when it replies START")


def stop_stands(error: store.StopStands) -> ApiError:
    """409 for ``opted_in`` on a number whose STOP stands."""
    return conflict(stop_reason(error.at))


def out(contact: store.Contact) -> ContactOut:
    return ContactOut.model_validate(contact)


@routes.route(
    "POST", "/contacts", summary="Create a contact", permission="contacts:write",
    body=CreateContact, response=ContactOut, status=201,
)
async def create_contact(call: Call, body: CreateContact) -> ContactOut:
    normalized, country = phone_fields(body.phone)
    properties, _, types = await checked_properties(call, body.properties)
    new = store.NewContact(
        email=body.email,
        phone=body.phone,
        normalized_phone=normalized,
        phone_country=country,
        sms_consent_status=body.sms_consent_status,
        sms_consent_source=body.sms_consent_source or "api",
        first_name=body.first_name,
        last_name=body.last_name,
        unsubscribed=body.unsubscribed,
        properties=properties,
        property_types=types,
    )
    try:
        contact = await store.create_contact(call.conn, call.team_id, new)
    except store.PropertyGone as error:
        raise gone(error) from None
    except store.StopStands as error:
        raise stop_stands(error) from None
    return out(contact)


@routes.route(
    "GET", "/contacts", summary="List contacts", permission="contacts:read",
    query=ContactQuery, response=ContactList,
)
async def list_contacts(call: Call, query: ContactQuery) -> dict[str, Any]:
    if query.segment_id is not None:
        if await segment_store.get_segment(call.conn, call.team_id, query.segment_id) is None:
            raise not_found("segment")
    where = store.ContactFilter(
        email=query.email,
        segment_id=query.segment_id,
        unsubscribed=query.unsubscribed,
        search=query.search,
    )
    found = await store.list_contacts(call.conn, call.team_id, where, query.limit + 1, query.offset)
    return page([out(contact) for contact in found], query.limit)


@routes.route(
    "GET", "/contacts/{contact_id}", summary="Retrieve a contact by id or email",
    permission="contacts:read", response=ContactOut, path_types=CONTACT_REF,
)
async def get_contact(call: Call, contact_id: str) -> ContactOut:
    contact = await store.get_contact(call.conn, call.team_id, contact_ref(contact_id))
    if contact is None:
        raise not_found("contact")
    return out(contact)


@routes.route(
    "PATCH", "/contacts/{contact_id}", summary="Update a contact (by id or email)",
    permission="contacts:write", body=UpdateContact, response=ContactOut,
    path_types=CONTACT_REF,
)
async def update_contact(call: Call, contact_id: str, body: UpdateContact) -> ContactOut:
    ref = contact_ref(contact_id)
    given = body.model_fields_set
    normalized, country = phone_fields(body.phone)
    properties, removed, types = await checked_properties(call, body.properties or {})
    changes = store.ContactChanges(
        given=frozenset(given),
        email=body.email,
        phone=body.phone,
        normalized_phone=normalized,
        phone_country=country,
        first_name=body.first_name,
        last_name=body.last_name,
        unsubscribed=body.unsubscribed,
        sms_consent_status=body.sms_consent_status,
        sms_consent_source=body.sms_consent_source or "api",
        set_properties=properties,
        remove_properties=removed,
        property_types=types,
    )
    try:
        contact = await store.update_contact(call.conn, call.team_id, ref, changes)
    except store.PropertyGone as error:
        raise gone(error) from None
    except store.StopStands as error:
        raise stop_stands(error) from None
    except store.Unreachable:
        raise unprocessable(
            "email, phone: a contact needs an email or a phone; this change would leave neither"
        ) from None
    if contact is None:
        raise not_found("contact")
    return out(contact)


@routes.route(
    "DELETE", "/contacts/{contact_id}", summary="Delete a contact (by id or email)",
    permission="contacts:write", status=204, path_types=CONTACT_REF,
)
async def delete_contact(call: Call, contact_id: str) -> Answer:
    if not await store.delete_contact(call.conn, call.team_id, contact_ref(contact_id)):
        raise not_found("contact")
    return Answer(204)
