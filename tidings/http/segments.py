"""Segments over HTTP, and their members.

Adding a contact to a segment it is in already succeeds with the same
membership, ``assigned_at`` included: the call is safe to repeat.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, Field

from tidings.http.contacts import CONTACT_REF, ContactList, find_contact_id, out
from tidings.http.envelope import ApiError, not_found
from tidings.http.models import RequestBody, Resource
from tidings.http.paging import Paging, page
from tidings.http.routing import Answer, Call, Routes
from tidings.storage import segments as store

routes = Routes("Segments", storage_units=True)


class CreateSegment(RequestBody):
    name: str = Field(min_length=1, max_length=100)


class SegmentOut(Resource):
    object: Literal["segment"] = "segment"
    id: UUID
    team_id: UUID
    name: str
    contact_count: int = Field(description="How many contacts the segment has")
    created_at: datetime
    updated_at: datetime


class SegmentList(BaseModel):
    object: Literal["list"] = "list"
    data: list[SegmentOut]
    has_more: bool


class MembershipOut(Resource):
    """A segment a contact belongs to: the segment's id, team, name and
    creation time, and when the contact was added to it."""

    id: UUID = Field(description="The segment's id")
    team_id: UUID
    name: str
    created_at: datetime = Field(description="When the segment was created")
    assigned_at: datetime = Field(description="When the contact was added to the segment")


class MembershipList(BaseModel):
    object: Literal["list"] = "list"
    data: list[MembershipOut]
    has_more: bool


@routes.route(
    "POST", "/segments", summary="Create a segment", permission="contacts:write",
    body=CreateSegment, response=SegmentOut, status=201,
)
async def create_segment(call: Call, body: CreateSegment) -> SegmentOut:
    return SegmentOut.of(await store.create_segment(call.conn, call.team_id, body.name))


@routes.route(
    "GET", "/segments", summary="List segments with their member counts",
    permission="contacts:read", query=Paging, response=SegmentList,
)
async def list_segments(call: Call, query: Paging) -> dict[str, Any]:
    found = await store.list_segments(call.conn, call.team_id, query.limit + 1, query.offset)
    return page([SegmentOut.of(segment) for segment in found], query.limit)


@routes.route(
    "GET", "/segments/{segment_id}", summary="Retrieve a segment", permission="contacts:read",
    response=SegmentOut,
)
async def get_segment(call: Call, segment_id: UUID) -> SegmentOut:
    segment = await store.get_segment(call.conn, call.team_id, segment_id)
    if segment is None:
        raise not_found("segment")
    return SegmentOut.of(segment)


@routes.route(
    "DELETE", "/segments/{segment_id}", summary="Delete a segment (its contacts stay)",
    permission="contacts:write", status=204,
)
async def delete_segment(call: Call, segment_id: UUID) -> Answer:
    if not await store.delete_segment(call.conn, call.team_id, segment_id):
        raise not_found("segment")
    return Answer(204)


@routes.route(
    "GET", "/segments/{segment_id}/contacts", summary="The contacts of a segment",
    permission="contacts:read", query=Paging, response=ContactList,
)
async def list_segment_contacts(call: Call, segment_id: UUID, query: Paging) -> dict[str, Any]:
    if await store.get_segment(call.conn, call.team_id, segment_id) is None:
        raise not_found("segment")
    found = await store.list_members(call.conn, segment_id, query.limit + 1, query.offset)
    return page([out(contact) for contact in found], query.limit)


@routes.route(
    "GET", "/contacts/{contact_id}/segments",
    summary="The segments of a contact (by id or email)", permission="contacts:read",
    query=Paging, response=MembershipList, path_types=CONTACT_REF,
)
async def list_contact_segments(call: Call, contact_id: str, query: Paging) -> dict[str, Any]:
    found = await store.contact_segments(
        call.conn, call.team_id, await find_contact_id(call, contact_id),
        query.limit + 1, query.offset,
    )
    return page([MembershipOut.of(membership) for membership in found], query.limit)


@routes.route(
    "POST", "/contacts/{contact_id}/segments/{segment_id}",
    summary="Add a contact (by id or email) to a segment (safe to repeat)",
    permission="contacts:write", response=MembershipOut, path_types=CONTACT_REF,
)
async def add_to_segment(call: Call, contact_id: str, segment_id: UUID) -> MembershipOut:
    contact = await find_contact_id(call, contact_id)
    try:
        # The contact may be deleted meanwhile: add_member checks it again.
        membership = await store.add_member(call.conn, call.team_id, segment_id, contact)
    except store.NoContact:
        raise not_found("contact") from None
    except store.NoSegment:
        raise not_found("segment") from None
    return MembershipOut.of(membership)


@routes.route(
    "DELETE", "/contacts/{contact_id}/segments/{segment_id}",
    summary="Remove a contact (by id or email) from a segment", permission="contacts:write",
    status=204, path_types=CONTACT_REF,
)
async def remove_from_segment(call: Call, contact_id: str, segment_id: UUID) -> Answer:
    contact = await find_contact_id(call, contact_id)
    try:
        removed = await store.remove_member(call.conn, call.team_id, segment_id, contact)
    except store.NoContact:
        raise not_found("contact") from None
    except store.NoSegment:
        raise not_found("segment") from None
    if not removed:
        raise ApiError(404, "NOT_FOUND", "the contact is not in this segment")
    return Answer(204)
