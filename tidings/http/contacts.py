"""Contacts over HTTP."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Self
from uuid import UUID

import phonenumbers
from pydantic import BaseModel, ConfigDict, EmailStr, Field, model_validator

from tidings.http.envelope import bad_request, conflict, not_found
from tidings.http.models import RequestBody
from tidings.http.routing import Call, Routes
from tidings.storage import contacts as store
from tidings.storage.errors import Duplicate

routes = Routes("Contacts")

ConsentStatus = Literal["unknown", "opted_in", "opted_out"]


class CreateContact(RequestBody):
    email: EmailStr | None = Field(None, max_length=320)
    phone: str | None = Field(
        None, min_length=1, max_length=32, description="International format, e.g. +14155550100"
    )
    first_name: str | None = Field(None, max_length=255)
    last_name: str | None = Field(None, max_length=255)
    unsubscribed: bool = False
    sms_consent_status: ConsentStatus = "unknown"
    sms_consent_source: str = Field("api", min_length=1, max_length=50)
    properties: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def reachable(self) -> Self:
        if self.email is None and self.phone is None:
            raise ValueError("a contact needs an email or a phone")
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
    sms_consent_updated_at: datetime | None
    sms_consent_source: str | None
    first_name: str | None
    last_name: str | None
    unsubscribed: bool
    properties: dict[str, Any]
    created_at: datetime
    updated_at: datetime


def normalize_phone(phone: str) -> tuple[str, str | None]:
    """E.164 form and region of an international phone number, or 400 naming ``phone``."""
    try:
        number = phonenumbers.parse(phone, None)
    except phonenumbers.NumberParseException:
        raise bad_request(
            f"phone: {phone!r} is not a phone number in international format (+country code)"
        ) from None
    if not phonenumbers.is_valid_number(number):
        raise bad_request(f"phone: {phone!r} is not a valid phone number")
    e164 = phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164)
    return e164, phonenumbers.region_code_for_number(number)


@routes.route(
    "POST", "/contacts", summary="Create a contact", permission="contacts:write",
    body=CreateContact, response=ContactOut, status=201,
)
async def create_contact(call: Call, body: CreateContact) -> ContactOut:
    normalized, country = normalize_phone(body.phone) if body.phone else (None, None)
    new = store.NewContact(
        email=body.email,
        phone=body.phone,
        normalized_phone=normalized,
        phone_country=country,
        sms_consent_status=body.sms_consent_status,
        sms_consent_source=body.sms_consent_source,
        first_name=body.first_name,
        last_name=body.last_name,
        unsubscribed=body.unsubscribed,
        properties=body.properties,
    )
    try:
        contact = await store.create_contact(call.conn, call.team_id, new)
    except Duplicate as duplicate:
        raise conflict(f"{duplicate.field}: {duplicate.message}") from None
    return ContactOut.model_validate(contact)


@routes.route(
    "GET", "/contacts/{contact_id}", summary="Retrieve a contact", permission="contacts:read",
    response=ContactOut,
)
async def get_contact(call: Call, contact_id: UUID) -> ContactOut:
    contact = await store.get_contact(call.conn, call.team_id, contact_id)
    if contact is None:
        raise not_found("contact")
    return ContactOut.model_validate(contact)
