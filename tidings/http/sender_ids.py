"""Sender IDs over HTTP (CONTRACT §8): who a team's text messages are from.

``type`` is ``alphanumeric`` (1 to 11 letters, digits and spaces, at least
one letter), ``long_code`` (a phone number, E.164 or digits, stored in
E.164) or ``short_code`` (3 to 8 digits). The provider decides approval:
the sandbox approves at once; Twilio approves alphanumeric IDs at once and
long and short codes when the account owns the number.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

import phonenumbers
from pydantic import BaseModel, Field

from tidings.fields import FieldError
from tidings.http.envelope import bad_request, not_found
from tidings.http.models import ListQuery, RequestBody, Resource
from tidings.http.paging import page
from tidings.http.routing import Answer, Call, Finish, Routes
from tidings.phones import parse_phone
from tidings.providers.sms import SenderIdDecision, SenderIdType
from tidings.storage import sender_ids as store
from tidings.storage.connection import Connection

routes = Routes("Sender IDs")

ALPHANUMERIC = re.compile(r"[A-Za-z0-9 ]{1,11}")
SHORT_CODE = re.compile(r"[0-9]{3,8}")
COUNTRY = r"^[A-Z]{2}$"


class CreateSenderId(RequestBody):
    value: str = Field(
        min_length=1, max_length=32,
        description="alphanumeric: 1-11 letters, digits, spaces (one letter at least); "
        "long_code: a phone number (E.164 or digits); short_code: 3-8 digits",
    )
    type: SenderIdType
    countries: list[str] | None = Field(
        None, max_length=250,
        description="ISO 3166-1 alpha-2 countries it is for; a long code's is its number's",
    )


class SenderIdOut(Resource):
    object: Literal["sender_id"] = "sender_id"
    id: UUID
    value: str
    type: SenderIdType
    status: SenderIdDecision
    countries: list[str]
    created_at: datetime
    updated_at: datetime


class SenderIdList(BaseModel):
    object: Literal["list"] = "list"
    data: list[SenderIdOut]
    has_more: bool


class SenderIdQuery(ListQuery):
    status: SenderIdDecision | None = None


def checked_value(value: str, type: SenderIdType) -> tuple[str, list[str]]:
    """The stored form of a sender ID and the countries its number implies; 400."""
    value = value.strip()
    if type == "alphanumeric":
        if not ALPHANUMERIC.fullmatch(value) or not any(c.isalpha() for c in value):
            raise bad_request(
                "value: an alphanumeric sender ID is 1 to 11 letters (A-Z), digits and "
                "spaces, with at least one letter"
            )
        return value, []
    if type == "short_code":
        if not SHORT_CODE.fullmatch(value):
            raise bad_request("value: a short code is 3 to 8 digits")
        return value, []
    number = value if value.startswith("+") else f"+{value}"
    if not number[1:].isdigit():
        raise bad_request("value: a long code is a phone number: E.164 (+country code) or digits")
    try:
        phone = parse_phone(number, "value", valid=False)
    except FieldError as error:
        raise bad_request(str(error)) from None
    if phone.country:
        return phone.e164, [phone.country]
    # A number no plan lists as assigned: the countries of its calling code.
    calling_code = phonenumbers.parse(phone.e164, None).country_code or 0
    regions = phonenumbers.region_codes_for_country_code(calling_code)
    return phone.e164, [region for region in regions if region.isalpha()]


def checked_countries(countries: list[str] | None, implied: list[str]) -> list[str]:
    if countries is None:
        return implied[:1]
    found: list[str] = []
    for index, country in enumerate(countries):
        if not re.fullmatch(COUNTRY, country) or country not in phonenumbers.SUPPORTED_REGIONS:
            raise bad_request(
                f"countries.{index}: {country!r} is not the ISO 3166-1 alpha-2 code of a "
                "country with a telephone numbering plan"
            )
        if country not in found:
            found.append(country)
    if len(implied) == 1 and found != implied:
        raise bad_request(f"countries: a long code is for its number's country {implied[0]}")
    if len(implied) > 1 and not set(found) <= set(implied):
        raise bad_request(
            f"countries: a long code is for a country of its calling code: {', '.join(implied)}"
        )
    return found


@routes.route(
    "POST", "/sender-ids", summary="Register a sender ID (approved by the provider)",
    permission="domains:write", body=CreateSenderId, response=SenderIdOut, status=201,
    pooled=False,
)
async def create_sender_id(call: Call, body: CreateSenderId) -> Finish:
    value, implied = checked_value(body.value, body.type)
    countries = checked_countries(body.countries, implied)
    # No connection is held while the provider reviews it (``pooled=False``).
    status = await call.service.sms.provider.review_sender_id(value, body.type)
    team_id = call.team_id

    async def create(conn: Connection) -> SenderIdOut:
        created = await store.create_sender_id(conn, team_id, value, body.type, status, countries)
        return SenderIdOut.of(created)

    return Finish(create)


@routes.route(
    "GET", "/sender-ids", summary="List sender IDs, newest first", permission="domains:read",
    query=SenderIdQuery, response=SenderIdList,
)
async def list_sender_ids(call: Call, query: SenderIdQuery) -> dict[str, Any]:
    found = await store.list_sender_ids(
        call.conn, call.team_id, query.status, query.limit + 1, query.offset
    )
    return page([SenderIdOut.of(item) for item in found], query.limit)


@routes.route(
    "GET", "/sender-ids/{sender_id}", summary="Retrieve a sender ID",
    permission="domains:read", response=SenderIdOut,
)
async def get_sender_id(call: Call, sender_id: UUID) -> SenderIdOut:
    found = await store.get_sender_id(call.conn, call.team_id, sender_id)
    if found is None:
        raise not_found("sender ID")
    return SenderIdOut.of(found)


@routes.route(
    "DELETE", "/sender-ids/{sender_id}",
    summary="Delete a sender ID: messages from it that wait to be sent will fail",
    permission="domains:write", status=204,
)
async def delete_sender_id(call: Call, sender_id: UUID) -> Answer:
    if not await store.delete_sender_id(call.conn, call.team_id, sender_id):
        raise not_found("sender ID")
    return Answer(204)
