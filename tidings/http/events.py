"""The team's event records and the catalogue of event types."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tidings.http.envelope import not_found
from tidings.http.models import list_of
from tidings.http.paging import Paging, page
from tidings.http.parsing import QueryId
from tidings.http.routing import Call, Routes
from tidings.storage import events as store
from tidings.webhooks.catalogue import EVENT_TYPES

routes = Routes("Events", storage_units=True)


class EventOut(BaseModel):
    """An event as recorded. Receivers get the same fields in the webhook body."""

    model_config = ConfigDict(from_attributes=True)

    object: Literal["event"] = "event"
    id: UUID
    type: str
    channel: Literal["email", "sms"] | None
    message_id: UUID | None
    to: str | None = Field(validation_alias="recipient")
    occurred_at: datetime
    data: dict[str, Any]
    created_at: datetime


class EventTypeOut(BaseModel):
    object: Literal["event_type"] = "event_type"
    name: str
    description: str


class EventQuery(Paging):
    type: Annotated[str, Field(json_schema_extra={"enum": list(EVENT_TYPES)})] | None = Field(
        None, description="One type of the catalogue (GET /event-types)"
    )
    message_id: QueryId | None = None

    @field_validator("type")
    @classmethod
    def _known(cls, value: str | None) -> str | None:
        if value is not None and value not in EVENT_TYPES:
            raise ValueError("is not an event type of the catalogue; see GET /event-types")
        return value


@routes.route(
    "GET", "/events", summary="List the team's events, newest first",
    permission="webhooks:read", query=EventQuery, response=list_of(EventOut),
)
async def list_events(call: Call, query: EventQuery) -> dict[str, Any]:
    found = await store.list_events(
        call.conn,
        call.team_id,
        query.limit + 1,
        query.offset,
        type=query.type,
        message_id=query.message_id,
    )
    return page([EventOut.model_validate(event) for event in found], query.limit)


@routes.route(
    "GET", "/events/{event_id}", summary="Retrieve an event", permission="webhooks:read",
    response=EventOut,
)
async def get_event(call: Call, event_id: UUID) -> EventOut:
    event = await store.get_event(call.conn, call.team_id, event_id)
    if event is None:
        raise not_found("event")
    return EventOut.model_validate(event)


@routes.route(
    "GET", "/event-types", summary="The catalogue of event types",
    permission="webhooks:read", query=Paging, response=list_of(EventTypeOut),
)
async def list_event_types(call: Call, query: Paging) -> dict[str, Any]:
    """Paged like every list (CONTRACT §2), in the catalogue's order."""
    names = list(EVENT_TYPES)[query.offset:query.offset + query.limit + 1]
    types = [EventTypeOut(name=name, description=EVENT_TYPES[name]) for name in names]
    return page(types, query.limit)
