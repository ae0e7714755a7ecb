"""Contact property definitions over HTTP.

A team defines each key its contacts' ``properties`` may hold, with a type
(string, number, boolean, date) and an optional fallback value of that type.
Deleting a definition removes its key from every contact of the team, and a
write of the key that meets the deletion either comes first (and loses its
value) or is refused.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, Field, field_validator

from tidings.fields import FieldError
from tidings.http.contact_fields import check_property_value
from tidings.http.envelope import bad_request, not_found
from tidings.http.models import RequestBody, Resource
from tidings.http.paging import Paging, page
from tidings.http.routing import Answer, Call, Routes
from tidings.storage import contact_properties as store
from tidings.storage.contact_properties import PropertyType

routes = Routes("Contact properties", storage_units=True)

# A property named like a contact field would be ambiguous as a CSV column.
RESERVED_KEYS = frozenset({
    "id", "team_id", "email", "phone", "normalized_phone", "phone_country",
    "sms_consent_status", "sms_consent_updated_at", "sms_consent_source", "first_name",
    "last_name", "unsubscribed", "properties", "segment_id", "created_at", "updated_at",
})

FALLBACK = "Used where a contact has no value; a value of `type`, or null for none"


class CreateProperty(RequestBody):
    key: str = Field(
        min_length=1, max_length=50, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Letters, digits and underscores; not a contact field's name",
    )
    type: PropertyType
    fallback_value: Any = Field(None, description=FALLBACK)

    @field_validator("key")
    @classmethod
    def not_reserved(cls, value: str) -> str:
        if value.lower() in RESERVED_KEYS:
            raise ValueError(f"{value!r} is the name of a contact field")
        return value


class UpdateProperty(RequestBody):
    """Only the fallback value can change: a key or a type change would
    strand the values contacts hold."""

    fallback_value: Any = Field(description=FALLBACK)


class PropertyOut(Resource):
    object: Literal["contact_property"] = "contact_property"
    id: UUID
    team_id: UUID
    key: str
    type: PropertyType
    fallback_value: Any
    created_at: datetime
    updated_at: datetime


class PropertyList(BaseModel):
    object: Literal["list"] = "list"
    data: list[PropertyOut]
    has_more: bool


def checked_fallback(kind: PropertyType, value: Any) -> Any:
    if value is None:
        return None
    try:
        return check_property_value(kind, value, "fallback_value")
    except FieldError as error:
        raise bad_request(f"{error} (the property's type is {kind})") from None


@routes.route(
    "POST", "/contact-properties", summary="Define a contact property",
    permission="contacts:write", body=CreateProperty, response=PropertyOut, status=201,
)
async def create_property(call: Call, body: CreateProperty) -> PropertyOut:
    fallback = checked_fallback(body.type, body.fallback_value)
    created = await store.create_property(
        call.conn, call.team_id, body.key, body.type, fallback
    )
    return PropertyOut.of(created)


@routes.route(
    "GET", "/contact-properties", summary="List contact properties",
    permission="contacts:read", query=Paging, response=PropertyList,
)
async def list_properties(call: Call, query: Paging) -> dict[str, Any]:
    found = await store.list_properties(call.conn, call.team_id, query.limit + 1, query.offset)
    return page([PropertyOut.of(item) for item in found], query.limit)


@routes.route(
    "GET", "/contact-properties/{property_id}", summary="Retrieve a contact property",
    permission="contacts:read", response=PropertyOut,
)
async def get_property(call: Call, property_id: UUID) -> PropertyOut:
    found = await store.get_property(call.conn, call.team_id, property_id)
    if found is None:
        raise not_found("contact property")
    return PropertyOut.of(found)


@routes.route(
    "PATCH", "/contact-properties/{property_id}", summary="Change a property's fallback value",
    permission="contacts:write", body=UpdateProperty, response=PropertyOut,
)
async def update_property(call: Call, property_id: UUID, body: UpdateProperty) -> PropertyOut:
    found = await store.get_property(call.conn, call.team_id, property_id)
    if found is None:
        raise not_found("contact property")
    fallback = checked_fallback(found.type, body.fallback_value)
    updated = await store.update_fallback(call.conn, call.team_id, property_id, fallback)
    if updated is None:
        raise not_found("contact property")
    return PropertyOut.of(updated)


@routes.route(
    "DELETE", "/contact-properties/{property_id}",
    summary="Delete a contact property and its values on every contact",
    permission="contacts:write", status=204,
)
async def delete_property(call: Call, property_id: UUID) -> Answer:
    # One transaction: a contact written meanwhile with the key either loses
    # its value or is refused (tidings.storage.contact_properties).
    async with call.conn.transaction():
        cleared = await store.delete_property(call.conn, call.team_id, property_id)
    if cleared is None:
        raise not_found("contact property")
    return Answer(204)
