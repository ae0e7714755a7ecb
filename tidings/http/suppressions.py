"""Suppressions over HTTP: addresses the team must not send to.

An address with an ``@`` is an email address, checked and stored in
lowercase; anything else is a phone number in international form, stored
in E.164. Each address is suppressed at most once per team.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, Field

from tidings.addresses import normalize_address
from tidings.fields import FieldError
from tidings.http.envelope import bad_request, conflict, not_found, rfc3339
from tidings.http.models import ListQuery, RequestBody, Resource
from tidings.http.paging import page
from tidings.http.routing import Answer, Call, Routes
from tidings.phones import parse_phone
from tidings.storage import suppressions as store
from tidings.storage.contacts import like_pattern
from tidings.storage.suppressions import Kind, Reason

routes = Routes("Suppressions", storage_units=True)


class CreateSuppression(RequestBody):
    address: str = Field(
        min_length=1, max_length=320,
        description="An email address, or a phone number in international form (+country code)",
    )
    reason: Reason = "manual"
    source_message_id: UUID | None = Field(None, description="The message that caused it")


class SuppressionOut(Resource):
    object: Literal["suppression"] = "suppression"
    id: UUID
    team_id: UUID
    address: str = Field(description="Email in lowercase, or phone in E.164")
    kind: Kind
    reason: Reason
    source_message_id: UUID | None
    created_at: datetime
    sms_opted_out_at: datetime | None = Field(
        description="When the number replied STOP (or was suppressed with the reason "
        "sms_opt_out), while that stands: only a START from the number lifts it, and "
        "DELETE is 409 meanwhile"
    )


class SuppressionList(BaseModel):
    object: Literal["list"] = "list"
    data: list[SuppressionOut]
    has_more: bool


class SuppressionQuery(ListQuery):
    reason: Reason | None = None
    search: str | None = Field(
        None, min_length=1, max_length=200, description="Case-insensitive partial match on address"
    )


# Reasons that only one kind of address can have: a phone cannot bounce or
# complain, and only a phone replies STOP.
ONLY_FOR: dict[str, Kind] = {"bounce": "email", "complaint": "email", "sms_opt_out": "phone"}


def stored_address(address: str) -> tuple[str, Kind]:
    """The stored form of an address and its kind; 400 naming ``address``."""
    if "@" in address:
        try:
            # Lowercased as it is stored (by PostgreSQL, see the storage module).
            return normalize_address(address, "address"), "email"
        except FieldError as error:
            reason = f"value is not a valid email address: {error.reason}"
            raise bad_request(f"address: {reason}") from None
    try:
        return parse_phone(address.strip(), "address").e164, "phone"
    except FieldError as error:
        raise bad_request(f"{error}; an email address needs an @") from None


@routes.route(
    "POST", "/suppressions", summary="Suppress an email address or phone number",
    permission="contacts:write", body=CreateSuppression, response=SuppressionOut, status=201,
    also_ok=((200, "An opt-out (sms_opt_out) recorded on the number's suppression of "
                   "another reason"),),
)
async def create_suppression(call: Call, body: CreateSuppression) -> SuppressionOut | Answer:
    address, kind = stored_address(body.address)
    if body.reason in ONLY_FOR and ONLY_FOR[body.reason] != kind:
        raise bad_request(f"reason: {body.reason} is only for "
                          f"{'an email address' if kind == 'phone' else 'a phone number'}")
    source = body.source_message_id
    if source is not None and not await store.is_message_of(call.conn, call.team_id, source):
        raise not_found(f"source_message_id: message {source}")
    suppression, new = await store.create_suppression(
        call.conn, call.team_id, address, kind, body.reason, source
    )
    if not new:  # a number suppressed already, its STOP now recorded on it
        return Answer(200, SuppressionOut.of(suppression))
    return SuppressionOut.of(suppression)


@routes.route(
    "GET", "/suppressions", summary="List suppressions", permission="contacts:read",
    query=SuppressionQuery, response=SuppressionList,
)
async def list_suppressions(call: Call, query: SuppressionQuery) -> dict[str, Any]:
    search = None if query.search is None else like_pattern(query.search.strip())
    found = await store.list_suppressions(
        call.conn, call.team_id, query.reason, search, query.limit + 1, query.offset
    )
    return page([SuppressionOut.of(item) for item in found], query.limit)


@routes.route(
    "GET", "/suppressions/{suppression_id}", summary="Retrieve a suppression",
    permission="contacts:read", response=SuppressionOut,
)
async def get_suppression(call: Call, suppression_id: UUID) -> SuppressionOut:
    found = await store.get_suppression(call.conn, call.team_id, suppression_id)
    if found is None:
        raise not_found("suppression")
    return SuppressionOut.of(found)


@routes.route(
    "DELETE", "/suppressions/{suppression_id}",
    summary="Lift a suppression: the address may be sent to again",
    permission="contacts:write", status=204,
)
async def delete_suppression(call: Call, suppression_id: UUID) -> Answer:
    try:
        lifted = await store.delete_suppression(call.conn, call.team_id, suppression_id)
    except store.OptedOut as stop:
        raise conflict(
            f"the number replied STOP ({rfc3339(stop.at)}): "
            "it stays suppressed until it replies START"
        ) from None
    if not lifted:
        raise not_found("suppression")
    return Answer(204)
